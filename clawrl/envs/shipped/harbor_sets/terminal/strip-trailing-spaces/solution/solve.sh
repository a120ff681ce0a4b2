#!/bin/bash
set -euo pipefail
cd /app
sed -i -E 's/[[:blank:]]+$//' notes/*.txt
