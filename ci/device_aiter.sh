#!/usr/bin/env bash
# On the lent NVIDIA GPU: AITER's Triton kernels as the aiter_triton backend (issue 6) and the
# float64 references on the device (issue 5).  Usage: ci/device_aiter.sh AITER_WHEEL_OR_DIR
# Logs to $OUT (or ./device-out).  Each step has its own time limit; a failing step does not
# stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TEALITE_AITER_PATH=${1:?usage: ci/device_aiter.sh AITER_WHEEL_OR_DIR}
export HYPOTHESIS_PROFILE=${PROFILE:-ci} TEALITE_VERIFY_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
step() { local name=$1 limit=$2; shift 2; echo "== $name" >&2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  tail -4 "$OUT/$name.log" >&2; }
step aiter_tests ${T_TESTS:-240} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_aiter_quantize.py tests/test_aiter_quantize_mxfp4.py tests/test_aiter_gemm.py \
  tests/test_aiter_qgemm.py tests/test_aiter_norms.py tests/test_aiter_fused.py \
  tests/test_aiter_triton_loader.py
step aiter_differential ${T_DIFF:-240} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_differential.py -k aiter_triton
step reference_device ${T_REF:-90} python3 -m pytest -q -p no:cacheprovider -rs \
  tests/test_reference_device_gemm.py tests/test_reference_device_agreement.py \
  tests/test_reference_device_routing.py
step gate_contracts ${T_OBS:-90} python3 -m tealite_verify gate contracts --observe --device cuda
step gate_capture ${T_GATE:-240} python3 -m tealite_verify gate capture --device cuda \
  --out "$OUT/gate-cuda.json"
step fuzz_throughput ${T_FUZZ:-200} python3 benchmarks/fuzz_throughput.py --device cuda \
  --seconds ${FUZZ_SECONDS:-15} --ops act_fwd layernorm_fwd --backends torch \
  --json "$OUT/fuzz.json"
