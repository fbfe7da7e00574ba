# Sourced by ci/device_check.sh and ci/device_family.sh (from the repo root of the GPU machine's
# copy): $OUT, the import path, compiled Triton (no interpreter), AITER's path made absolute,
# the environment printed to $OUT/env.txt, and the op names of $OPS as a pytest -k expression
# ($sel) and as tealite_verify arguments (${op_args[@]}).
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
[ -n "${TEALITE_AITER_PATH:-}" ] && export TEALITE_AITER_PATH=$(realpath "$TEALITE_AITER_PATH")
OPS=${OPS:?set OPS to the op names}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'device', torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
sel=$(echo "$OPS" | sed 's/ / or /g')
op_args=(); for o in $OPS; do op_args+=(--op "$o"); done
