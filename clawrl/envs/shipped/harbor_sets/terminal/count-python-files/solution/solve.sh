#!/bin/bash
set -euo pipefail
cd /app
find src -name '*.py' | wc -l | tr -d ' ' > count.txt
