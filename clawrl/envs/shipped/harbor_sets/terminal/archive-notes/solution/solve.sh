#!/bin/bash
set -euo pipefail
cd /app
tar -czf backup.tar.gz notes
