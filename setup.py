"""The wheel's build step beyond pyproject.toml: two things a wheel carries that a checkout does not hold.

* GPT-2's tokenizer files (``gpt2-vocab.json``, ``gpt2-merges.txt``), copied from the data directory
  (:func:`repro.text.data_files.gpt2_tokenizer_files`: each checked against its pinned sha256) into
  ``repro/text/gpt2_tokenizer/``, beside their license (``repro/text/GPT2_TOKENIZER_LICENSE``: openai/gpt-2's Modified
  MIT License allows the copies). An installed wheel then tokenizes, and ``repro export-hf`` writes a complete
  Hugging Face directory, without a data directory. A build without the data directory skips them, saying so; that
  wheel reads them from the data directory, and ``repro export-hf`` refuses in one line where it has none.
* ``repro/BUILD_COMMIT``: the git commit the wheel was built from, which ``repro --version`` prints.

Nothing is copied into the checkout itself (the data stays out of the repository); an editable install has neither.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _commit() -> str:
    """``<sha>`` of the checkout, ``<sha> (modified)`` with uncommitted changes under repro/ or evals/, else ''."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != ROOT:
            return ""
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "repro", "evals")
        return git("rev-parse", "HEAD") + (" (modified)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        sys.path.insert(0, str(ROOT))
        from repro.text.data_files import DataError, gpt2_tokenizer_files

        package = Path(self.build_lib) / "repro"
        try:
            files = gpt2_tokenizer_files()
        except (DataError, OSError) as err:
            print(f"setup.py: the wheel carries no GPT-2 tokenizer files ({err})", file=sys.stderr)
        else:
            (package / "text" / "gpt2_tokenizer").mkdir(parents=True, exist_ok=True)
            for path in files:
                shutil.copyfile(path, package / "text" / "gpt2_tokenizer" / path.name)
        commit = _commit()
        if commit:
            (package / "BUILD_COMMIT").write_text(commit + "\n")


setup(cmdclass={"build_py": BuildPy})
