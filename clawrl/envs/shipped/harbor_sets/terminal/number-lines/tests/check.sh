#!/bin/bash
set -euo pipefail
printf "1: Roses are red\n2: Violets are blue\n3: Shells are sandboxed\n4: And so are you\n" | diff - numbered.txt
