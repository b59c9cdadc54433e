"""``python -m repro`` is the ``repro`` command (for environments where console scripts are not on PATH)."""

import sys

from repro.cli import main

sys.exit(main())
