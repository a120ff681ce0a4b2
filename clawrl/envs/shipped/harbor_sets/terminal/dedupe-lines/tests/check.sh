#!/bin/bash
set -euo pipefail
printf "b\na\nc\nd\n" | diff - out.txt
