#!/bin/bash
set -euo pipefail
cd /app
cat > stats/center.py <<'EOF'
def median(values):
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
EOF
