#!/bin/bash
set -euo pipefail
cd /app
python3 -c 'import json; d = json.load(open("config.json")); print("\n".join(f"{k}={d[k]}" for k in sorted(d)))' > .env
