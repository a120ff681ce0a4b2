#!/bin/bash
set -euo pipefail
cd /app
expand -t 4 code.py > /tmp/c && cat /tmp/c > code.py
