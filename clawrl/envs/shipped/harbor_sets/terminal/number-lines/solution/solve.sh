#!/bin/bash
set -euo pipefail
cd /app
awk '{print NR ": " $0}' poem.txt > numbered.txt
