#!/bin/bash
set -euo pipefail
printf "name\nAda\nLinus\nGrace\n" | diff - col2.txt
