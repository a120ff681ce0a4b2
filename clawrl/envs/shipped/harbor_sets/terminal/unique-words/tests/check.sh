#!/bin/bash
set -euo pipefail
printf "apple\nfig\nkiwi\npear\nplum\n" | diff - unique.txt
