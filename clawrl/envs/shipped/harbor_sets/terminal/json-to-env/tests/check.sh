#!/bin/bash
set -euo pipefail
printf "DEBUG=false\nHOST=127.0.0.1\nPORT=8080\n" | diff - .env
