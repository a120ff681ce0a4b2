#!/bin/bash
set -euo pipefail
cd /app
sort -n -r numbers.txt > sorted.txt
