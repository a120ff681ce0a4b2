#!/bin/bash
set -euo pipefail
test -z "$(grep -P '\t' code.py || true)"
grep -q '^        return 2$' code.py
