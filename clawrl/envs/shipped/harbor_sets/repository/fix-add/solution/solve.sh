#!/bin/bash
set -euo pipefail
cd /app
sed -i 's/return a - b/return a + b/' calc/ops.py
