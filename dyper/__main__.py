"""``python -m dyper``: the ``dyper`` command."""

import sys

from dyper.monitor.cli import main

sys.exit(main())
