#!/bin/bash
set -euo pipefail
cd /app
cat > textkit/words.py <<'EOF'
def reverse_words(sentence):
    return " ".join(reversed(sentence.split()))
EOF
