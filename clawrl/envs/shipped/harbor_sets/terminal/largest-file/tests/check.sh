#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < largest.txt)" = b.log
