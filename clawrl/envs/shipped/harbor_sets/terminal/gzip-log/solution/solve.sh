#!/bin/bash
set -euo pipefail
cd /app
gzip app.log
