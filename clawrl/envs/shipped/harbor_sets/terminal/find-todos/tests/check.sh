#!/bin/bash
set -euo pipefail
printf "a.py\nlib/c.py\n" | diff - todo.txt
