"""``python -m tensorpress.cli``: run the command line and exit with its status."""

import sys

from .app import main

if __name__ == "__main__":
    sys.exit(main())
