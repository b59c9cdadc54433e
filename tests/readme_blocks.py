"""The ``bash`` blocks of README.md and slurm/README.md, read one way by every test that runs what they show.

A section is named by the start of its heading line (``"## GPU experiments"``) and runs to the next ``## `` heading,
so a ``###`` section ends where its ``##`` section ends. A command line is a line of a block with its comment cut off
(``#`` to the end of the line) and blank lines dropped; a test that needs the block as a script (a batch file with
``#SBATCH`` lines) reads its text.
"""

from __future__ import annotations

import re
from pathlib import Path

from repro.checkout import REPO_ROOT

README = REPO_ROOT / "README.md"
SLURM_README = REPO_ROOT / "slurm" / "README.md"


def bash_blocks(readme: Path = README, section: str | None = None) -> list[str]:
    """The text of every ```` ```bash ```` block of ``readme``, or of its section whose heading starts with
    ``section``, in order."""
    text = readme.read_text(encoding="utf-8")
    if section is not None:
        _, heading, rest = text.partition("\n" + section)
        assert heading, f"{readme.name} has no section {section!r}"
        text = rest.split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks, f"{readme.name} has no bash block" + (f" in {section!r}" if section else "")
    return blocks


def commands(readme: Path = README, section: str | None = None, block: int = 0) -> list[str]:
    """The command lines of one block (the first by default): comments cut off, blank lines dropped."""
    lines = (line.split("#", 1)[0].strip() for line in bash_blocks(readme, section)[block].splitlines())
    return [line for line in lines if line]
