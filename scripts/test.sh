#!/usr/bin/env bash
# Install dyper into a fresh virtual environment per CPython >= 3.11 found on
# this machine (python3.11, python3.12, ... on PATH or under pyenv) and run the
# whole test suite in each. Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

pythons=()
seen=""
for minor in 11 12 13 14 15; do
  for cand in "python3.$minor" "$HOME/.pyenv/versions/3.$minor"*/bin/python3.$minor; do
    exe=$(command -v "$cand" 2>/dev/null || true)
    [ -n "$exe" ] && [ -x "$exe" ] || continue
    # pyenv's shims exist for versions that are installed but not selected: they fail when run.
    "$exe" -c 'import sys' >/dev/null 2>&1 || continue
    case " $seen " in *" 3.$minor "*) continue ;; esac
    seen="$seen 3.$minor"
    pythons+=("$exe")
    break
  done
done
if [ ${#pythons[@]} -eq 0 ]; then
  echo "no CPython >= 3.11 found: install one (e.g. pyenv install 3.12)" >&2
  exit 2
fi

# The dashboard's browser tests drive Debian's chromium through chromedriver.
# Install both when missing and we can (root with apt-get); without them those
# tests fail saying how to install them (or skip with DYPER_SKIP_BROWSER=1).
if ! command -v chromium >/dev/null 2>&1 || ! { command -v chromedriver || ls /usr/bin/chromedriver; } >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "--- installing chromium and chromium-driver for the browser tests"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 \
           && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } \
      || echo "could not install chromium and chromium-driver: the browser tests will say what is missing" >&2
  fi
fi

# Every Python's environment at once: installing (which builds the C walker) is
# CPU work that two cores do in half the time, and no test runs yet to be disturbed.
echo "--- installing into .venv-3.x for: ${pythons[*]}"
logs=$(mktemp -d)
pids=()
for py in "${pythons[@]}"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=".venv-$ver"
  ( { [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"; } \
    && "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' ) > "$logs/$ver.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    # Once more alone: the three share the source tree's build metadata.
    py=${pythons[$i]}
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    echo "installing for Python $ver beside the others failed; again alone" >&2
    if ! ".venv-$ver/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' > "$logs/$ver.log" 2>&1; then
      echo "installing for $py failed:" >&2
      cat "$logs/$ver.log" >&2
      exit 2
    fi
  fi
done
rm -rf "$logs"

status=0
first=1
for py in "${pythons[@]}"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=".venv-$ver"
  echo "=== Python $ver ($py) ==="
  if [ $first = 1 ]; then
    # The style guide's static checks, once, with the oldest supported Python.
    echo "--- ruff and mypy --strict"
    "$venv/bin/python" -m ruff check dyper agent monitor proflets tests bench || status=1
    # mypy cannot follow setuptools' package-dir mapping (agent/ is dyper.agent):
    # it checks a tree of links laid out as the installed package is.
    typed=$(mktemp -d)
    mkdir "$typed/dyper"
    ln -s "$PWD"/dyper/*.py "$PWD/agent" "$PWD/monitor" "$PWD/proflets" "$typed/dyper/"
    ( cd "$typed" && "$OLDPWD/$venv/bin/python" -m mypy --config-file "$OLDPWD/pyproject.toml" -p dyper ) || status=1
    rm -rf "$typed"
    first=0
  fi
  # Two workers, a test file each at a time: most tests wait on real processes and
  # sockets, so two at once halve the run on a 2-core machine (DYPER_TEST_WORKERS=0:
  # one process, in file order).
  workers=${DYPER_TEST_WORKERS:-2}
  if [ "$workers" = 0 ]; then
    "$venv/bin/python" -m pytest "$@" || status=$?
  else
    "$venv/bin/python" -m pytest -n "$workers" --dist loadfile "$@" || status=$?
  fi
done
exit $status
