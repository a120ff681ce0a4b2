#!/bin/bash
set -euo pipefail
test -x bin/build.sh && test -x bin/test.sh && test ! -x bin/README
