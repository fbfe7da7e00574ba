#!/usr/bin/env bash
# Run the differential slice on a CUDA/ROCm device (the lent GPU): Hypothesis "local" profile
# on the device, then the main job at large shapes.  Writes logs to $OUT (or ./device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 - <<'PY' | tee "$OUT/env.txt"
import torch, hypothesis, numpy
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)
print("hypothesis", hypothesis.__version__, "numpy", numpy.__version__)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
m = torch.backends.cuda.matmul
print("allow_tf32", m.allow_tf32, "fp16_rpr", m.allow_fp16_reduced_precision_reduction,
      "bf16_rpr", m.allow_bf16_reduced_precision_reduction)
PY
TEALITE_VERIFY_DEVICE=cuda HYPOTHESIS_PROFILE=${PROFILE:-local} timeout ${PYTEST_TIMEOUT:-300} \
  python3 -m pytest tests/test_differential.py -m differential -q -p no:cacheprovider \
  2>&1 | tee "$OUT/pytest_cuda.log" | tail -25
timeout ${RUN_TIMEOUT:-240} python3 -m tealite_verify run --device cuda --size large \
  --examples ${EXAMPLES:-6} --json "$OUT/run_large.json" 2>&1 | tee "$OUT/run_large.log" | tail -30
# The FP8 GEMMs through torch._scaled_mm (cuBLASLt), many drawn cases.
timeout ${QGEMM_TIMEOUT:-120} python3 -m tealite_verify run --device cuda --size local --op qgemm \
  --backend scaled_mm --backend torch --examples ${QGEMM_EXAMPLES:-80} \
  --json "$OUT/run_qgemm.json" 2>&1 | tee "$OUT/run_qgemm.log" | tail -8
