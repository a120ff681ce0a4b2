#!/bin/bash
set -euo pipefail
printf "1000\n120\n42\n7\n5\n0\n-3\n" | diff - sorted.txt
