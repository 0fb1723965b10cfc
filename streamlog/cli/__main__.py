"""`python -m streamlog.cli ...`: the same as the `streamlog` command."""

import sys

from streamlog.cli import main

sys.exit(main())
