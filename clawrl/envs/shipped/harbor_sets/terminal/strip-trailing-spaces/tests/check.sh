#!/bin/bash
set -euo pipefail
test -z "$(grep -lE '[[:blank:]]+$' notes/*.txt || true)"
printf "one\ntwo\nthree\n" | diff - notes/a.txt
