#!/bin/bash
set -euo pipefail
cd /app
wc -l < data.txt | tr -d ' ' > count.txt
