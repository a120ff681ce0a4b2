#!/bin/bash
set -euo pipefail
test "$(tr -d "[:space:]" < version.txt)" = 3.14.1
