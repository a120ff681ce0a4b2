#!/bin/bash
set -euo pipefail
test -x hello.sh && test "$(./hello.sh)" = "Hello, clawrl!"
