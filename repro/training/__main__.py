import sys

from repro.training.cli import main

sys.exit(main())
