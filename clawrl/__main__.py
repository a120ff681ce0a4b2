import sys

from clawrl.cli import main

sys.exit(main())
