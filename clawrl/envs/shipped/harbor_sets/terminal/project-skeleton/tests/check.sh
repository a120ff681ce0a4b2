#!/bin/bash
set -euo pipefail
test -d project/src && test -d project/tests && test -d project/docs && test -f project/README.md && test ! -s project/README.md
