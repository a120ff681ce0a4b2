#!/bin/bash
set -euo pipefail
cd /app
printf '#!/bin/sh\necho "Hello, clawrl!"\n' > hello.sh
chmod +x hello.sh
