#!/bin/bash
set -euo pipefail
printf "alpha\nbeta\ngamma\n" | diff - full.txt
