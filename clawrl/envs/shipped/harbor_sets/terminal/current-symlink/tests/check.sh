#!/bin/bash
set -euo pipefail
test -L current && test "$(readlink current)" = releases/v2 && test "$(cat current/app.txt)" = two
