"""Commands run as processes forked from one warm interpreter (:func:`forked`): for the installed wheel's commands
(tests/foundation/test_packaging.py, tests/evals/test_user_path_from_a_wheel.py: this file, run by the venv's
Python outside the checkout, is the interpreter) and for commands with optional packages hidden
(tests/foundation/test_optional_imports.py: the interpreter starts with the hiding ``sitecustomize``).

A fresh interpreter spends ~3 CPU-s importing torch and pandas (dependencies, which read no repro setting) before a
command does anything; here those imports are paid once, and each command is a child forked after them, with its own
environment, working directory, standard output and error (files) and exit status, running as ``python -m``/``-c``/a
script would, or ``repro`` through the environment's ``console_scripts`` entry point (importlib.metadata, what
``VENV/bin/repro`` calls). Nothing of repro is imported before the fork, so each command imports repro in its own
environment and folder. What this skips is only the interpreter's start: each test file keeps real runs of the
entry points it checks.

Input: a JSON list of ``{"program": "repro" | "python", "args": [...], "cwd": DIR, "env": {...}, "paths": [...]}``
(``env``: the whole environment; ``paths``, optional: files whose existence is noted as soon as the command ended,
before the next one runs). Output (standard output): a JSON list of ``{"code", "stdout", "stderr", "exists"}``, one per
command, in order (``exists``: each of its ``paths`` to whether it existed then).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path


def clean_env(env: dict | None = None) -> dict[str, str]:
    """This environment without what points repro at the checkout or its folders (an installed wheel's), with ``env``
    added."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "REPRO_RESULTS_DIR", "REPRO_ROOT", "REPRO_DATA", "REPRO_DATA_MIRROR")}
    return {**clean, **(env or {})}


class Done(subprocess.CompletedProcess):
    """A forked command's outcome (:func:`forked`), with ``exists``: its ``paths`` to whether each existed as soon as
    it ended."""

    def __init__(self, args: list[str], result: dict) -> None:
        super().__init__(args, result["code"], result["stdout"], result["stderr"])
        self.exists = {Path(path): there for path, there in result["exists"].items()}


def forked(python: Path | str, cwd: Path, *commands: tuple[str, ...], env: dict[str, str],
           paths: dict[int, list[Path]] | None = None, envs: dict[int, dict] | None = None) -> list[Done]:
    """Each of ``commands`` (``("repro", ARGS...)`` or ``("python", ARGS...)``), in turn, as a process forked from
    one interpreter ``python`` that imported torch and pandas once (:func:`main`): what separate runs show (exit
    status, output, files) without an interpreter's start and those imports each (~3 CPU-s). ``env``: the whole
    environment (the interpreter's, and each command's); ``envs``: for the command at an index, variables set for it
    alone; ``paths``: for the command at an index, files whose existence is noted as soon as it ended."""
    batch = [{"program": command[0], "args": list(command[1:]), "cwd": str(cwd),
              "env": {**env, **(envs or {}).get(number, {})},
              "paths": [str(path) for path in (paths or {}).get(number, [])]}
             for number, command in enumerate(commands)]
    done = subprocess.run([str(python), __file__], input=json.dumps(batch), cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [Done(list(command), result) for command, result in zip(commands, json.loads(done.stdout))]


# the interpreter the commands fork from (run as a script)


def _child(program: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The forked command; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        os.dup2(os.open(out, os.O_WRONLY | os.O_TRUNC), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        if program == "repro":  # the console script: the wheel's entry point, as VENV/bin/repro calls it
            from importlib.metadata import entry_points

            (script,) = entry_points(group="console_scripts", name="repro")
            sys.argv = [os.path.join(os.path.dirname(sys.executable), "repro"), *args]
            sys.path[0] = os.path.dirname(sys.argv[0])  # as a script's first entry: its folder, not this one's
            script.load()()
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""  # the current folder, as for ``python -c``
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        elif args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()  # as for ``python -m``
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:  # a script
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
    finally:
        # as an interpreter ends: its exit functions (those of the modules imported before the fork, as a fresh
        # interpreter importing them would have, and the command's: logging's, multiprocessing's), then the streams
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream: nothing more to say
                pass
        os._exit(code & 0xFF)


def main() -> None:
    import pandas  # noqa: F401 - the imports nearly every command pays; dependencies that read no repro setting
    import torch  # noqa: F401

    commands = json.load(sys.stdin)
    results = []
    folder = tempfile.mkdtemp()  # not TemporaryDirectory, whose exit function each child would run
    try:
        for number, command in enumerate(commands):
            out, err = os.path.join(folder, f"{number}.out"), os.path.join(folder, f"{number}.err")
            for path in (out, err):
                open(path, "w").close()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(command["program"], command["args"], command["cwd"], command["env"], out, err)
            _, status = os.waitpid(pid, 0)
            with open(out) as stdout, open(err) as stderr:
                results.append({"code": os.waitstatus_to_exitcode(status), "stdout": stdout.read(),
                                "stderr": stderr.read(),
                                "exists": {path: os.path.exists(path) for path in command.get("paths", [])}})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
