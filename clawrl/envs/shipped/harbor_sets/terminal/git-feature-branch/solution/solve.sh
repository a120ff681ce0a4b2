#!/bin/bash
set -euo pipefail
cd /app
cd repo
git init -q
git add -A
git -c user.name=agent -c user.email=agent@example.com commit -q -m start
git checkout -q -b feature
echo new > feature.txt
git add feature.txt
git -c user.name=agent -c user.email=agent@example.com commit -q -m feature
