"""Imported first by every Python the suite starts (tests/preload is first on their PYTHONPATH, the
way coverage.py reaches the subprocesses it measures): a `python [-u] -m clawrl ARGS...` started
while a preloader is named becomes a stand-in for the same command forked from it
(preload_client.py). Any other program, and any command the preloader refuses, runs untouched.
Nothing in the package knows of it."""

import os
import sys

if os.environ.get("CLAWRL_TEST_PRELOAD_SOCKET") and "clawrl" in sys.orig_argv[1:4]:
    import preload_client

    preload_client.stand_in_for(sys.orig_argv)
