#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < top.txt)" = the
