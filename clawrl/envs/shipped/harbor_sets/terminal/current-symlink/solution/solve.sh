#!/bin/bash
set -euo pipefail
cd /app
ln -s releases/v2 current
