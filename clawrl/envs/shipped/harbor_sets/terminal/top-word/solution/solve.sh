#!/bin/bash
set -euo pipefail
cd /app
tr ' ' '\n' < text.txt | grep -v '^$' | sort | uniq -c | sort -rn | head -n 1 | awk '{print $2}' > top.txt
