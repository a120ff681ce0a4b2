#!/bin/bash
set -euo pipefail
cd /app
sed -i 's/return max(high, min(low, x))/return max(low, min(high, x))/' mathx/bounds.py
