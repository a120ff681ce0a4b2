#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < count.txt)" = 37
