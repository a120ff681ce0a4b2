#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < sum.txt)" = "$(sha256sum data.dat | cut -d" " -f1)"
