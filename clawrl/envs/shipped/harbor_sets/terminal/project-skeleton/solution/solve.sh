#!/bin/bash
set -euo pipefail
cd /app
mkdir -p project/src project/tests project/docs
touch project/README.md
