#!/usr/bin/env bash
# Correctness of a set of ops on the GPU machine, compiled (no interpreter), in one call:
#
#   OPS="grouped_gemm router_fwd ..." TESTS="tests/test_triton_grouped_gemm.py" bash ci/device_check.sh
#
# 1. the differential suite for OPS on the device (Hypothesis $PROFILE, default ci), every
#    available backend (AITER's Triton kernels where $TEALITE_AITER_PATH points at aiter/);
# 2. the main job ($SIZE shapes, default local) for OPS, with the graph-replay check ($REPLAYS, default 2);
# 3. TESTS: kernel test files that run compiled on CUDA when the interpreter is off;
# 4. a short differential fuzz of OPS ($FUZZ_MINUTES, default 1; 0 skips it).
# Each step has its own timeout; logs and JSON go to $OUT (default ./device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/_device_ops_env.sh
step() { echo "== $1 ($(date +%T))"; }
# A timeout of 0 skips its step (timeout 0 itself would mean no limit at all).
if [ "${DIFF_TIMEOUT:-200}" != 0 ]; then
  step differential
  TEALITE_VERIFY_DEVICE=cuda HYPOTHESIS_PROFILE=${PROFILE:-ci} timeout "${DIFF_TIMEOUT:-200}" \
    python3 -m pytest tests/test_differential.py -m differential -q -p no:cacheprovider \
    -k "$sel" -rfEs 2>&1 | tee "$OUT/pytest_cuda.log" | grep -vE "^(SKIPPED|\.)" | tail -30
fi
if [ "${RUN_TIMEOUT:-150}" != 0 ]; then
  step "run + graph replay"
  timeout "${RUN_TIMEOUT:-150}" python3 -m tealite_verify run --device cuda \
    --size "${SIZE:-local}" --examples "${EXAMPLES:-3}" --graph-replay "${REPLAYS:-2}" \
    "${op_args[@]}" --json "$OUT/run_large.json" 2>&1 | tee "$OUT/run_large.log" | tail -45
fi
if [ -n "${TESTS:-}" ]; then
  step "kernel tests"
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest $TESTS -q -p no:cacheprovider -rfEs 2>&1 \
    | tee "$OUT/tests_cuda.log" | tail -30
fi
if [ "${FUZZ_MINUTES:-1}" != 0 ]; then
  step fuzz
  timeout $(( ${FUZZ_MINUTES:-1} * 60 + 60 )) python3 -m tealite_verify fuzz "${op_args[@]}" \
    --device cuda --minutes "${FUZZ_MINUTES:-1}" --corpus "$OUT/findings" --json "$OUT/fuzz.json" \
    2>&1 | tee "$OUT/fuzz.log" | tail -20
fi
step done
