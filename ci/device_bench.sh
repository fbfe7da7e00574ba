#!/usr/bin/env bash
# The benchmark suite on the GPU machine (from the repo root of its copy of the tree):
#
#   bash ci/device_bench.sh [AITER]
#
# AITER (or $TEALITE_AITER_PATH): an amd-aiter wheel, an unpacked wheel or the directory holding
# aiter/ (e.g. carried as ./shared-wheels/amd_aiter-0.1.7.post2.dev18-py3-none-any.whl, or to
# carry 8 MB instead of 40: unzip -q WHEEL 'aiter/*' 'amd_aiter-*.dist-info/METADATA' -d .aiter
# and pass .aiter).  Without it the AITER rows are skipped with the reason.
#
# Writes to $OUT (default ./device-out): bench.json (pytest-benchmark JSON: wall stats, device
# numbers in extra_info), bench.md (the Markdown record, also printed last), bench.log, env.txt.
# Budget: the pytest run is capped at $BENCH_TIMEOUT s (default 420) so the whole call stays
# under 8 minutes; REPS / WALL_REPS / WARMUP tune the repetitions (30 / 5 / 3), SIZE the shapes
# (large; tiny for a quick check of the script itself).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
AITER=${1:-${TEALITE_AITER_PATH:-}}
if [ -n "$AITER" ]; then
  if [ ! -e "$AITER" ]; then echo "device_bench: AITER path $AITER does not exist" >&2; exit 2; fi
  export TEALITE_AITER_PATH
  TEALITE_AITER_PATH=$(realpath "$AITER")
fi

{ nvidia-smi || echo "nvidia-smi failed"
  python3 - <<'PY'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip,
      "triton", triton.__version__)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
} >"$OUT/env.txt" 2>&1
tail -n 2 "$OUT/env.txt"

extra=()
# One stuck case must not eat the whole budget: per-test limit where pytest-timeout exists.
if python3 -c "import pytest_timeout" 2>/dev/null; then extra+=(--timeout "${TEST_TIMEOUT:-150}"); fi
timeout "${BENCH_TIMEOUT:-420}" python3 -m pytest benchmarks/ -q -p no:cacheprovider -rs \
  --benchmark-json "$OUT/bench.json" --benchmark-columns=median,rounds --bench-size "${SIZE:-large}" \
  --bench-reps "${REPS:-30}" --bench-wall-reps "${WALL_REPS:-5}" --bench-warmup "${WARMUP:-3}" \
  "${extra[@]}" >"$OUT/bench.log" 2>&1
rc=$?
grep -E "passed|failed|SKIPPED|FAILED|Error" "$OUT/bench.log" | tail -n 40
if [ ! -s "$OUT/bench.json" ]; then
  echo "device_bench: no JSON written (pytest exit $rc; 124 = timed out); see $OUT/bench.log" >&2
  tail -n 40 "$OUT/bench.log"
  exit "${rc:-1}"
fi
python3 benchmarks/report.py "$OUT/bench.json" -o "$OUT/bench.md" && cat "$OUT/bench.md"
exit "$rc"
