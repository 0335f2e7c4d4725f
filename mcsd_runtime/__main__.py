import sys

from mcsd_runtime.cli import main

sys.exit(main())
