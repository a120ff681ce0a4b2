#!/bin/bash
set -euo pipefail
cd repo
test "$(git rev-list --count feature)" = 2
test "$(git show feature:feature.txt)" = new
test "$(git ls-tree --name-only -r feature~1)" = app.py
