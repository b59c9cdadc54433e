#!/usr/bin/env bash
# Run the test suite on the lowest torch pyproject.toml declares and on the newest torch the registry serves,
# each in a virtual environment of its own. The machine's own torch is left as it is.
#
#   scripts/torch_versions.sh                  # floor and newest: one venv each, then python -m pytest -q in each
#   scripts/torch_versions.sh 2.7.1 2.15.0     # these versions instead
#   scripts/torch_versions.sh --floor          # the floor only (CI's torch-range job), --newest the newest only
#   scripts/torch_versions.sh --dry-run        # print the versions and the commands, install and run nothing
#   scripts/torch_versions.sh -- tests/gna     # pytest arguments after --
#
# The floor is the version in pyproject's "torch>=X" (with its patch level: X must name one). The newest is the
# first version `pip index versions torch` lists with the machine's pip configuration lifted
# (PIP_CONFIG_FILE=/dev/null), since that configuration may cap torch below the newest release; the installs use
# the same override. Outside the CPU wheel on the machine, these are the registry's CUDA builds (~5 GB each): they
# run on CPU. Venvs go to $REPRO_VENV_DIR (default ~/.cache/repro/venvs), one per version, kept for the next run.
# Each version's pytest output goes to $REPRO_VENV_DIR/torch-<version>.log, and its summary (counts, exit code, git
# commit, date, python) is appended to results/torch_versions.jsonl when the whole suite ran (no pytest arguments);
# the script ends with one line per version and exits 1 when any version failed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "torch_versions: error: $1" >&2; exit 2; }

DRY=0
WHICH=both
VERSIONS=()
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --floor) WHICH=floor ;;
    --newest) WHICH=newest ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*.[0-9]*.[0-9]*) VERSIONS+=("$1") ;;
    *) die "'$1' is not a torch version like 2.4.1 (major.minor.patch), --floor, --newest, --dry-run or --" ;;
  esac
  shift
done

PY="${REPRO_PYTHON:-python3}"
VENVS="${REPRO_VENV_DIR:-$HOME/.cache/repro/venvs}"

# (both set a variable rather than print: a die inside $(...) would only leave the subshell)
floor_version() {
  local spec
  spec="$(grep -oE '"torch>=[0-9][0-9.]*"' pyproject.toml | head -n1 | tr -d '"')"
  [ -n "$spec" ] || die "pyproject.toml has no \"torch>=X.Y.Z\" dependency"
  spec="${spec#torch>=}"
  [[ "$spec" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "pyproject's torch floor '$spec' must name a patch release (X.Y.Z)"
  FLOOR="$spec"
}

newest_version() {
  local line
  line="$(PIP_CONFIG_FILE=/dev/null "$PY" -m pip index versions torch 2>/dev/null | grep -m1 '^torch (' || true)"
  [ -n "$line" ] || die "pip index versions torch gave no answer (is the registry reachable?)"
  line="${line#torch (}"
  NEWEST="${line%)}"
}

if [ ${#VERSIONS[@]} -eq 0 ]; then
  [ "$WHICH" = newest ] || { floor_version; VERSIONS+=("$FLOOR"); }
  [ "$WHICH" = floor ] || { newest_version; VERSIONS+=("$NEWEST"); }
fi
WHOLE=0
if [ ${#PYTEST_ARGS[@]} -eq 0 ]; then
  PYTEST_ARGS=(-q -n auto --maxprocesses 4 --dist loadgroup)  # the README's test command
  WHOLE=1
fi

echo "torch versions: ${VERSIONS[*]} (venvs under $VENVS)"
declare -A RESULT
STATUS=0
for version in "${VERSIONS[@]}"; do
  venv="$VENVS/torch-$version"
  log="$VENVS/torch-$version.log"
  install=(env PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install --quiet "torch==$version")
  deps=("$venv/bin/python" -m pip install --quiet -e ".[dev]" "torch==$version")
  # REPRO_TORCH_VERSIONS_RUN: this run is the proof being made, so the test that looks for a committed proof of
  # pyproject's floor skips
  run=(env "PYTHONPATH=$PWD" REPRO_TORCH_VERSIONS_RUN=1 "$venv/bin/python" -m pytest "${PYTEST_ARGS[@]}")
  if [ "$DRY" = 1 ]; then
    echo "== torch $version"
    echo "$PY -m venv $venv"
    echo "${install[*]}"
    echo "PIP_CONFIG_FILE=/dev/null ${deps[*]}"
    echo "${run[*]} > $log"
    continue
  fi
  mkdir -p "$VENVS"
  if [ ! -x "$venv/bin/python" ]; then
    echo "== torch $version: creating $venv"
    "$PY" -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
    echo "== torch $version: installing (a CUDA build can take minutes)"
    "${install[@]}"
  fi
  PIP_CONFIG_FILE=/dev/null "${deps[@]}"
  echo "== torch $version: python -m pytest ${PYTEST_ARGS[*]} (log: $log)"
  set +e
  "${run[@]}" > "$log" 2>&1
  code=$?
  set -e
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n1 | tr -d '=' | xargs)"
  RESULT[$version]="$summary (exit $code)"
  if [ "$code" != 0 ]; then
    STATUS=1
    echo "== torch $version: the last lines of $log"
    tail -n 60 "$log"
  fi
  if [ "$WHOLE" = 1 ]; then
    "$venv/bin/python" - "$summary" "$code" >> results/torch_versions.jsonl <<'PY'
import datetime, json, platform, re, subprocess, sys
import torch
summary, code = sys.argv[1], int(sys.argv[2])
counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                            text=True).stdout.strip())
print(json.dumps(dict(torch=torch.__version__, python=platform.python_version(), exit_code=code, **counts,
                      summary=summary, git_commit=commit, git_dirty=dirty, machine=platform.machine(),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))))
PY
  fi
done
[ "$DRY" = 1 ] && exit 0
for version in "${VERSIONS[@]}"; do
  echo "torch $version: ${RESULT[$version]}"
done
exit "$STATUS"
