#!/bin/bash
set -euo pipefail
cd /app
sha256sum data.dat | cut -d' ' -f1 > sum.txt
