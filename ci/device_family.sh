#!/usr/bin/env bash
# One family's checks on the GPU machine (from the repo root of its copy of the tree):
#
#   OPS="attention_fwd attention_bwd" BENCH="benchmarks/test_bench_attention.py" \
#     bash ci/device_family.sh
#
# 1. the differential suite for OPS on the device (Hypothesis $PROFILE, default local);
# 2. the main job at large shapes for OPS (the float64 reference judged on the device);
# 3. a time-bounded differential fuzz of OPS ($FUZZ_MINUTES, default 2; 0 skips it);
# 4. the BENCH files (pytest-benchmark JSON + the Markdown report), skipped when BENCH is empty.
# AITER's Triton kernels run where $TEALITE_AITER_PATH points at the aiter package.  Logs and
# JSON go to $OUT (default ./device-out).  Every step has its own timeout so one stuck step
# cannot eat the call.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/_device_ops_env.sh
if [ "${DIFF_TIMEOUT:-150}" != 0 ]; then
  TEALITE_VERIFY_DEVICE=cuda HYPOTHESIS_PROFILE=${PROFILE:-local} timeout "${DIFF_TIMEOUT:-150}" \
    python3 -m pytest tests/test_differential.py -m differential -q -p no:cacheprovider -k "$sel" \
    2>&1 | tee "$OUT/pytest_cuda.log" | tail -15
fi
if [ "${RUN_TIMEOUT:-120}" != 0 ]; then
  timeout "${RUN_TIMEOUT:-120}" python3 -m tealite_verify run --device cuda --size large \
    --examples "${EXAMPLES:-4}" "${op_args[@]}" --json "$OUT/run_large.json" 2>&1 \
    | tee "$OUT/run_large.log" | tail -25
fi
if [ "${FUZZ_MINUTES:-2}" != 0 ]; then
  timeout $(( ${FUZZ_MINUTES:-2} * 60 + 60 )) python3 -m tealite_verify fuzz "${op_args[@]}" \
    --device cuda --minutes "${FUZZ_MINUTES:-2}" --corpus "$OUT/findings" \
    --json "$OUT/fuzz.json" 2>&1 \
    | tee "$OUT/fuzz.log" | tail -20
fi
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 -m pytest $BENCH -q -p no:cacheprovider -rs \
    --benchmark-json "$OUT/bench.json" --benchmark-columns=median,rounds --bench-size large \
    --bench-reps "${REPS:-20}" --bench-wall-reps 3 --bench-warmup 3 >"$OUT/bench.log" 2>&1
  grep -E "passed|failed|FAILED|Error" "$OUT/bench.log" | tail -n 20
  [ -s "$OUT/bench.json" ] && python3 benchmarks/report.py "$OUT/bench.json" -o "$OUT/bench.md" \
    && cat "$OUT/bench.md"
fi
