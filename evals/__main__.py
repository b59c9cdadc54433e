"""``python -m evals``: see :mod:`evals.cli`."""

import sys

from evals.cli import main

sys.exit(main())
