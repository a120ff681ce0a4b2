#!/bin/bash
# The verifier: the fraction of /tests/test_*.py's tests that pass against the package in /app.
mkdir -p /logs/verifier
cd /app
python3 - <<'EOF' > /logs/verifier/tests.log 2>&1
import sys, unittest
sys.path.insert(0, "/app")
suite = unittest.defaultTestLoader.discover("/tests", pattern="test_*.py", top_level_dir="/tests")
result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
total = result.testsRun
passed = total - len(result.failures) - len(result.errors)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write(f"{passed / total if total else 0:.4f}\n")
EOF
test -f /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
