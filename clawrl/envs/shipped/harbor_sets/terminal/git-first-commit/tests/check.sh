#!/bin/bash
set -euo pipefail
cd project
test "$(git log --format=%s)" = initial
test "$(git ls-files | sort | tr '\n' ' ')" = "README.md src/main.py "
test -z "$(git status --porcelain)"
