#!/bin/bash
set -euo pipefail
mkdir -p /tmp/x && tar -xzf backup.tar.gz -C /tmp/x
diff -r notes /tmp/x/notes
