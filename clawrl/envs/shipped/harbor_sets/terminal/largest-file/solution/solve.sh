#!/bin/bash
set -euo pipefail
cd /app
ls -S files | head -n 1 > largest.txt
