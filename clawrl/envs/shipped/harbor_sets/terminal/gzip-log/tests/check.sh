#!/bin/bash
set -euo pipefail
test ! -e app.log && test "$(gzip -dc app.log.gz)" = "$(printf "line one\nline two")"
