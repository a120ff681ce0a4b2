#!/bin/bash
set -euo pipefail
cd /app
awk '!seen[$0]++' in.txt > out.txt
