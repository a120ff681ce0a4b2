#!/bin/bash
set -euo pipefail
cd /app
cat > textkit/count.py <<'EOF'
def word_count(text):
    return len(text.split())
EOF
