"""``python -m repro`` is the ``repro`` command (for environments where console scripts are not on PATH)."""

import sys

try:
    from repro.cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C while the modules load, before any handler is in place
    print("repro: interrupted (SIGINT) before it started; nothing was done", file=sys.stderr)
    code = 130
sys.exit(code)
