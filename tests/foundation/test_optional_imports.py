"""Issue 25: no import that a command does not need. With ``datasets`` and the other optional packages made
unimportable (a ``sitecustomize`` put first on PYTHONPATH installs an import hook that refuses them), the core
commands run, every module of repro/ and evals/ imports, a command that does need one says so in one line (exit
status 2), and existing tests that read no data through them pass (those that do skip, naming the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.optional import BrokenPackage, MissingPackage, available, pip_name, require
from repro.results import REPO_ROOT
from repro.testing import needs
from tests.foundation.warm_commands import Done, forked

#: the "run" command below compiles the smoke point toy_1rank's toy GPT: in the group of the files that compile it
#: (why, in tests/gpu_path/test_gpu_path_experiment.py), so that it reads TorchInductor's cache instead of building
#: the same kernels again in another worker at the same time (this file: ~130 CPU-s with an empty cache, ~37 warm)
pytestmark = pytest.mark.xdist_group("toy-gpt-compile")

#: optional packages (repro.optional); the core needs torch, numpy, pandas and tqdm only
OPTIONAL = ("datasets", "tokenizers", "transformers", "lm_eval", "natten", "deepspeed", "megatron", "pynvml",
            "tensorboard", "safetensors", "accelerate")
#: also optional: only repro.figures (drawing) imports them
FIGURES = ("matplotlib", "seaborn")

SHIM = '''
"""Written by tests/foundation/test_optional_imports.py: $REPRO_TEST_HIDE names packages that cannot be imported."""
import os
import sys


class _Hide:
    """Read at each import: a process forked with another $REPRO_TEST_HIDE hides those packages instead."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in os.environ.get("REPRO_TEST_HIDE", "").split(","):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, _Hide())
'''

#: imports every module of repro/ and evals/ (not the __main__ ones, which run a command) and prints the failures
IMPORT_ALL = '''
import importlib, json, sys
from pathlib import Path

failures = {}
for package in ("repro", "evals"):
    for path in sorted(Path(package).rglob("*.py")):
        parts = path.with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            importlib.import_module(name)
        except BaseException as err:
            failures[name] = f"{type(err).__name__}: {err}"
print(json.dumps(failures))
'''


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hide_packages")
    (folder / "sitecustomize.py").write_text(SHIM)
    return folder


def _env(shim_dir: Path, hidden) -> dict[str, str]:
    """The environment of a Python process with the packages in ``hidden`` unimportable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim_dir), str(REPO_ROOT)]),
           "REPRO_TEST_HIDE": ",".join(hidden), "HF_DATASETS_OFFLINE": "1"}
    env.pop("PYTHONSTARTUP", None)
    return env


def _run(argv: list[str], shim_dir: Path, hidden, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    """``python argv`` in the repository with the packages in ``hidden`` unimportable, a new interpreter."""
    return subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=_env(shim_dir, hidden), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def warm(shim_dir, tmp_path_factory, data_dir) -> dict[str, Done]:
    """The file's commands but its few real ones (a new interpreter each: the shim's test, ``repro list``, ``evals
    --help``, the inner pytest), each a process forked in turn from one interpreter started with the shim, which
    imported torch and pandas once (tests/foundation/warm_commands.py), with its own hidden packages, environment,
    output and exit status; by name, for the tests below."""
    results, reading = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("reading")
    (reading / "a.txt").write_text("one document\n")
    every = OPTIONAL + FIGURES
    named = {
        # the compiled variants on one rank, the eager one at tp 2 on two: the smoke scale's third point
        # (toy_1rank_eager, the eager variant on one rank) reaches no code these two do not, and took about a sixth
        # of the command's CPU time
        "run": (every, ("-m", "repro", "--results-dir", str(results), "run", "megatron_weak_scaling_gpu", "--scale",
                        "smoke", "--point", "toy_1rank", "--point", "toy_tp2")),
        "claims": (every, ("-m", "repro", "--results-dir", str(results), "claims")),  # no figures
        "import_all_but_datasets": (("datasets",), ("-c", IMPORT_ALL)),
        "import_all_but_any": (every, ("-c", IMPORT_ALL)),
        "figures": (FIGURES, ("-m", "repro", "--results-dir", str(reading), "figures")),
        "count": (("datasets",), ("-m", "evals", "--data-dir", str(data_dir), "count")),
        "corpus": (("datasets",), ("-m", "repro.training.corpus", "--input", str(reading / "a.txt"), "--data-dir",
                                   str(data_dir), "--output-prefix", str(reading / "c"))),
        "eval_run": (("datasets",), ("-m", "repro", "--results-dir", str(reading), "run", "eval_wikitext_lambada")),
    }
    done = forked(sys.executable, REPO_ROOT, *(("python", *argv) for _, argv in named.values()),
                  env=_env(shim_dir, every),
                  envs={number: {"REPRO_TEST_HIDE": ",".join(hidden)} for number, (hidden, _) in
                        enumerate(named.values())})
    return {"results": results, **dict(zip(named, done))}


def test_the_shim_hides_the_packages(shim_dir):
    probe = "import sys; from repro.optional import available; print(available(sys.argv[1]))"
    done = _run(["-c", probe, "datasets"], shim_dir, ("datasets",))
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    done = _run(["-c", "import datasets"], shim_dir, ("datasets",))
    assert done.returncode == 1 and "No module named 'datasets' (hidden by the test)" in done.stderr


def test_core_commands_run_without_optional_packages(shim_dir, warm):
    hidden = OPTIONAL + FIGURES
    listed = _run(["-m", "repro", "list"], shim_dir, hidden)
    assert listed.returncode == 0 and "megatron_weak_scaling_gpu" in listed.stdout, listed.stderr
    assert _run(["-m", "evals", "--help"], shim_dir, hidden).returncode == 0
    run, claims = warm["run"], warm["claims"]
    assert run.returncode == 0 and "megatron_weak_scaling_gpu: ok" in run.stdout, run.stdout + run.stderr
    assert claims.returncode == 0 and (warm["results"] / "claims.md").exists(), claims.stderr


def test_every_module_imports_without_datasets(warm):
    done = warm["import_all_but_datasets"]
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_every_module_but_the_figures_imports_without_any_optional_package(warm):
    done = warm["import_all_but_any"]
    assert done.returncode == 0, done.stderr
    failures = json.loads(done.stdout.splitlines()[-1])
    assert failures and all(name.startswith("repro.figures") for name in failures), failures
    assert all(why.startswith("MissingPackage: drawing figures needs the package 'matplotlib'") and
               why.endswith("pip install matplotlib") for why in failures.values()), failures


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()


def test_a_command_that_needs_a_missing_package_says_so_in_one_line(warm):
    line = _one_line(warm["figures"])
    assert line == ("repro: error: drawing figures needs the package 'matplotlib', which is not installed; "
                    "install it with: pip install matplotlib")


def test_reading_data_without_datasets_is_one_line(warm):
    line = _one_line(warm["count"])
    assert line.startswith("repro eval: error: reading the WikiText-103 test file needs the package 'datasets'")
    assert line.endswith("install it with: pip install datasets")
    line = _one_line(warm["corpus"])
    assert line.startswith("repro corpus: error: tokenizing a corpus needs the package 'datasets'")
    line = _one_line(warm["eval_run"])
    assert line.startswith("repro: error: reading the WikiText-103 test file needs the package 'datasets'")


def test_existing_tests_pass_or_skip_by_name_without_optional_packages(shim_dir):
    """Tests that read no data through the optional packages pass; those that do skip and name the package."""
    files = ["tests/foundation/test_cli_help.py", "tests/training/test_corpus.py",
             "tests/evals/test_evals_detokenize.py", "tests/experiments/test_spine_figures.py",
             "tests/training/test_train_cli.py::test_samples_do_not_depend_on_steps_and_validation_loss_falls",
             "tests/training/test_train_cli.py::test_training_on_tokenized_wikitext103_lowers_validation_loss"]
    done = _run(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files], shim_dir, OPTIONAL + FIGURES,
                timeout=600)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and "failed" not in summary and "error" not in summary, done.stdout[-3000:]
    passed = int(summary.split(" passed")[0].split()[-1])
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert passed >= 10 and skips, done.stdout[-3000:]
    for line in skips:  # each names its package (the data directory missing is the other allowed reason)
        assert "pip install" in line or "could not import" in line or "not available" in line, line


def test_require_names_the_package_and_its_pip_install(tmp_path, monkeypatch):
    with pytest.raises(MissingPackage) as missing:
        require("repro_no_such_package", "this test")
    assert isinstance(missing.value, ImportError)
    assert str(missing.value) == ("this test needs the package 'repro_no_such_package', which is not installed; "
                                  "install it with: pip install repro_no_such_package")
    assert pip_name("lm_eval.api.model") == "lm-eval" and pip_name("megatron.core") == "megatron-core"
    (tmp_path / "repro_broken_package.py").write_text("import repro_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # installed but broken (a dependency missing, or an error while it loads): a BrokenPackage, not a missing one
    with pytest.raises(BrokenPackage, match=r"which is installed but cannot be imported \(ModuleNotFoundError: No "
                                            r"module named 'repro_missing_dependency'\); repair the install, e\.g\. "
                                            r"pip install --force-reinstall repro_broken_package"):
        require("repro_broken_package", "this test")
    (tmp_path / "repro_raising_package.py").write_text("raise RuntimeError('compiled against another numpy')\n")
    with pytest.raises(BrokenPackage, match=r"\(RuntimeError: compiled against another numpy\)"):
        require("repro_raising_package", "this test")
    assert not isinstance(missing.value, BrokenPackage)
    assert require("json", "this test").dumps([]) == "[]"
    assert available("json") and not available("repro_no_such_package") and not available("repro_nope.sub")


def test_needs_marks_skip_with_the_pip_command():
    mark = needs("json", "repro_no_such_package").mark
    assert mark.args == (True,)
    assert mark.kwargs["reason"] == ("needs the optional package(s) repro_no_such_package: "
                                     "pip install repro_no_such_package")
    assert needs("json").mark.args == (False,)
