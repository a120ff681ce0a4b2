#!/bin/bash
set -euo pipefail
cd /app
sort -u words.txt > unique.txt
