#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < total.txt)" = 91
