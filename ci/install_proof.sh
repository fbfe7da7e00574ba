#!/usr/bin/env bash
# Issue 18's proof that tealite installs into the user's torch stack, not ours (docs/install.md
# records a run):
#   ci/install_proof.sh [WORKDIR] [TORCH_SPEC] [EXTRAS]
#   (defaults: /tmp/tealite-install-proof, torch==2.11.0, [triton]; EXTRAS '' for none: a torch
#   older than 2.8 requires a triton older than the [triton] extra's 3.4)
# 1. the user's stack: a fresh venv with TORCH_SPEC installed as a user would (PyPI's build, its
#    CUDA libraries and the triton it requires), not the version CI pins (ci/constraints-cpu.txt);
# 2. `pip install --report` of this repository with EXTRAS (no constraints: as a user);
# 3. ci/pip_report.py: pip's report must not (re)install torch or triton, and the versions the
#    venv reports afterwards must be the ones it held;
# 4. the main job there, from outside the repository (the installed copy is what runs), the
#    Triton kernels in the CPU interpreter.
# Downloads some GB the first time (pip's cache keeps them); pip's own configuration applies
# (PIP_FIND_LINKS etc.).  Exit status: nonzero when a step fails or torch was replaced.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/tealite-install-proof}
TORCH_SPEC=${2:-torch==2.11.0}
EXTRAS=${3-[triton]}
PY=${PYTHON:-python3}
VENV="$WORK/venv"
versions() {  # the distributions that matter, as the venv reports them
  "$VENV/bin/python" - <<'EOF'
from importlib import metadata
for name in ("torch", "triton", "tealite"):
    try:
        print(f"{name}={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
EOF
}

mkdir -p "$WORK"
rm -rf "$VENV"
echo "== 1. the user's stack: $TORCH_SPEC in a fresh venv ($PY: $("$PY" --version))"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
versions | tee "$WORK/before.txt"

echo "== 2. pip install --report $WORK/report.json '$ROOT$EXTRAS'"
"$VENV/bin/python" -m pip install -q --report "$WORK/report.json" "$ROOT$EXTRAS"

echo "== 3. pip's report and the versions after"
mapfile -t held < <(grep -E '^(torch|triton)=' "$WORK/before.txt")
"$VENV/bin/python" "$ROOT/ci/pip_report.py" "$WORK/report.json" "${held[@]}"
versions | tee "$WORK/after.txt"
if ! diff <(grep -E '^(torch|triton)=' "$WORK/after.txt") \
          <(printf '%s\n' "${held[@]}") >/dev/null; then
  echo "install_proof: torch / triton versions changed" >&2
  exit 1
fi

echo "== 4. the main job in that venv (from $WORK: the installed copy runs)"
cd "$WORK"
export TRITON_INTERPRET=1  # no GPU here: tealite's Triton kernels in the CPU interpreter
"$VENV/bin/python" - <<'EOF'
import tealite, torch
from tealite import registry
print("tealite from", tealite.__file__)
print("torch", torch.__version__, "| cuda build", torch.version.cuda, "| hip", torch.version.hip)
for name, backend in registry.backends().items():
    print(f"  {name}: {backend.unavailable_reason() or 'available'}")
EOF
"$VENV/bin/python" -m tealite_verify run --op gemm --op qgemm --examples 3
