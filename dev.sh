#!/usr/bin/env bash
# One entry point that does all set-up on a fresh machine, then runs what you ask:
#   ./dev.sh run   [args]  the main job: python -m tealite_verify run (CPU, torch backend default)
#   ./dev.sh test  [args]  the test suite (pytest; unit + differential tests)
#   ./dev.sh py    [args]  python inside the project venv
# The venv lives in .venv (override with TEALITE_VENV).  pyproject.toml declares torch / triton
# ranges; the exact CPU builds installed here are pinned in ci/constraints-cpu.txt.  The install
# is redone only when pyproject.toml, ci/aiter-pin.txt or ci/constraints-cpu.txt change.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TEALITE_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.tealite-installed"
want=$(cat pyproject.toml ci/aiter-pin.txt ci/constraints-cpu.txt | sha256sum | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "dev.sh: setting up $VENV (torch CPU build, test and triton extras)..." >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -c ci/constraints-cpu.txt -e ".[test,triton]" >&2
  # AITER, pinned in ci/aiter-pin.txt (the gate's baseline is for that version): only its
  # Triton kernels run here, loaded without ROCm, so its runtime deps (pandas, einops, psutil,
  # pybind11: its JIT / HIP paths) are not installed.  `import aiter` itself needs ROCm.
  "$VENV/bin/python" -m pip install -q --no-deps -r ci/aiter-pin.txt >&2
  echo "$want" > "$stamp"
fi
cmd=${1:-run}
shift || true
case "$cmd" in
  run)  exec "$VENV/bin/python" -m tealite_verify run "$@" ;;
  test) exec "$VENV/bin/python" -m pytest "$@" ;;
  py)   exec "$VENV/bin/python" "$@" ;;
  *)    echo "usage: ./dev.sh {run|test|py} [args...]" >&2; exit 2 ;;
esac
