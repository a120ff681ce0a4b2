#!/bin/bash
set -euo pipefail
test -z "$(grep -rl colour --include='*.md' docs)"
grep -q 'Pick a color.' docs/intro.md && grep -q 'Each color has a name.' docs/guide/style.md
grep -q 'colour stays here' docs/keep.txt
