#!/bin/bash
set -euo pipefail
cd /app
grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]+' contacts.txt | sort -u > emails.txt
