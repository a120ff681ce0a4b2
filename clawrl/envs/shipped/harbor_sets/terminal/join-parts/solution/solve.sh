#!/bin/bash
set -euo pipefail
cd /app
cat part1.txt part2.txt part3.txt > full.txt
