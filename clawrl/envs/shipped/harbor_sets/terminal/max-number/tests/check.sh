#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < max.txt)" = 256
