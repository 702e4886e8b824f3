"""`python -m mstail ...` is the `mstail` command."""

import sys

from mstail.tailer.app.cli import main

sys.exit(main())
