#!/bin/bash
# The verifier: reward 1 when check.sh (every line must succeed) passes, else 0.
mkdir -p /logs/verifier
cd /app
if bash /tests/check.sh >/logs/verifier/check.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
