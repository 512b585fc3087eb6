"""python3 -m remora: the rocprof-attach command (see remora/cli.py)."""

import sys

from .cli import main

sys.exit(main(prog="python3 -m remora"))
