#!/bin/bash
set -euo pipefail
cd /app
cd src && grep -rl TODO . | sed 's|^\./||' | sort > ../todo.txt
