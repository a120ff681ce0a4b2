#!/bin/bash
set -euo pipefail
cd /app
python3 -c 'import json; print(json.load(open("package.json"))["version"])' > version.txt
