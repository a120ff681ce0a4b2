#!/bin/bash
set -euo pipefail
cd /app
chmod +x bin/*.sh
chmod -x bin/README
