#!/bin/bash
set -euo pipefail
cd /app
grep -c ERROR app.log > errors.txt
