#!/bin/bash
set -euo pipefail
cd /app
tr '[:lower:]' '[:upper:]' < shout.txt > /tmp/up && cat /tmp/up > shout.txt
