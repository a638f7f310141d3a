import sys

from dyper.monitor.cli import main

sys.exit(main())
