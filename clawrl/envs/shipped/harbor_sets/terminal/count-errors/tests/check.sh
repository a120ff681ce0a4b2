#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < errors.txt)" = 3
