#!/bin/bash
set -euo pipefail
printf "PLEASE BE LOUD\nVERY LOUD\n" | diff - shout.txt
