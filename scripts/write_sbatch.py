#!/usr/bin/env python
"""(Re)write ``slurm/<experiment>.sbatch`` for every registered experiment (``repro.harness.sbatch``).

Usage: ``python scripts/write_sbatch.py [--check]``; ``--check`` writes nothing and exits 1 when a file is missing
or differs from what the experiment's declaration gives (tests run the same check).
"""

from __future__ import annotations

import sys

from repro.experiments import registry
from repro.harness.sbatch import render, sbatch_path, write


def main(argv: list[str]) -> int:
    check = "--check" in argv
    reg = registry()
    for module, error in reg.errors.items():
        print(f"warning: {module} not loaded: {error.strip().splitlines()[-1]}", file=sys.stderr)
    stale = []
    for exp in reg:
        path = sbatch_path(exp.name)
        if check:
            if not path.exists() or path.read_text() != render(exp):
                stale.append(str(path))
        else:
            print(write(exp))
    if stale:
        print("out of date (run python scripts/write_sbatch.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
