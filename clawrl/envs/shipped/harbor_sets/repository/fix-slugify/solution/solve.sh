#!/bin/bash
set -euo pipefail
cd /app
cat > textkit/slug.py <<'EOF'
import re


def slugify(title):
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))
EOF
