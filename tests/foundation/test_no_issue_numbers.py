"""The code a user runs and reads says what it does, not which tracker entry asked for it: no issue numbers in
repro/, evals/, slurm/, scripts/ or bench/ (their docstrings, comments and messages). A number means nothing to a
reader outside this project's tracker; the behaviour it points to is described where it is built. Tests may keep
them: they record why a case exists."""

from __future__ import annotations

import re

from repro.results import REPO_ROOT

FOLDERS = ("repro", "evals", "slurm", "scripts", "bench")
SUFFIXES = (".py", ".sh", ".sbatch")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_no_issue_numbers_in_shipped_code():
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if ISSUE.search(line):
                        found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "issue numbers in code:\n" + "\n".join(found)
