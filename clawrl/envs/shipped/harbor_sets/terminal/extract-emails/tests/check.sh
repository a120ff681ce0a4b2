#!/bin/bash
set -euo pipefail
printf "ann@example.com\nbob@work.org\ncarol.d@uni.edu\n" | diff - emails.txt
