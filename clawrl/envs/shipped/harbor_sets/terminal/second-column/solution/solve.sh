#!/bin/bash
set -euo pipefail
cd /app
cut -f2 data.tsv > col2.txt
