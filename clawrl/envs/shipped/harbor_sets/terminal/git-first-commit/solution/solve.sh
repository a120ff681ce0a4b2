#!/bin/bash
set -euo pipefail
cd /app
cd project
git init -q
git add -A
git -c user.name=agent -c user.email=agent@example.com commit -q -m initial
