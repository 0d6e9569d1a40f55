"""`python -m hal.cli ...`: the `hal` command without its console script (tests, a venv's python)."""
import sys

from hal.cli import main

sys.exit(main())
