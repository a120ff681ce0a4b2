#!/bin/bash
set -euo pipefail
test -f photos/beach.jpg && test -f photos/city.jpg && test -f photos/dog.png && test -f photos/notes.txt
test -z "$(ls photos | grep '\.jpeg$')"
