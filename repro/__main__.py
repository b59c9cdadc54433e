"""``python -m repro`` is the ``repro`` command (for environments where console scripts are not on PATH)."""

from repro.cliargs import run_entry_point

run_entry_point("repro.commands", "repro")  # the front: repro.cli loads only where needed
