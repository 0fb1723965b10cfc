"""`python -m streamlog ...` runs the command line (see streamlog/cli/)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
