#!/bin/bash
set -euo pipefail
cd /app
find docs -name '*.md' -exec sed -i 's/colour/color/g' {} +
