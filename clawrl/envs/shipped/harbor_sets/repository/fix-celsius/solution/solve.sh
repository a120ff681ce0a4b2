#!/bin/bash
set -euo pipefail
cd /app
sed -i 's|celsius \* 5 / 9 + 32|celsius * 9 / 5 + 32|' units/temperature.py
