#!/bin/bash
set -euo pipefail
cd /app
tr ',' '\n' < numbers.csv | sort -n | tail -n 1 > max.txt
