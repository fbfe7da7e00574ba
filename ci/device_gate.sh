#!/usr/bin/env bash
# On the lent NVIDIA GPU: the AITER gate compiled beside the interpreter (issue 12).
#
#   ci/device_gate.sh TREES_DIR [TAG ...]
#
# TREES_DIR holds TAG.tar.xz archives of ci/aiter_source.sh exports (the device machine reaches
# no network; carry them, e.g. as an ignored folder named in `carry`).  The first TAG is the
# baseline (default: every archive, oldest first).  Steps, each with its own time limit:
#   1. capture the baseline on the GPU, compiled (gate capture --device cuda);
#   2. per candidate TAG, in parallel: the baseline's cases re-run in Triton's interpreter on
#      the host CPU (--candidate-out), then compiled on the GPU with that run as --cross-check,
#      so a case or an observed field that differs between the two is an interpreter gap;
#   (PINNED=0 skips step 2; an existing capture in $OUT is reused)
#   3. with BUMPS=1: every tag captured compiled, and each consecutive bump compared compiled
#      (previous tag's capture -> tag);
#   4. a table: exit codes (interpreted, compiled), wall times, entry-point verdicts.
# Everything lands in $OUT (or ./device-out): reports, candidate runs, logs, gate-gpu.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}; mkdir -p "$OUT"
TREES=${1:?usage: ci/device_gate.sh TREES_DIR [TAG ...]}; shift
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
WORK=${WORK:-/tmp/aiter-trees}; mkdir -p "$WORK"
tags=("$@")
if [ ${#tags[@]} -eq 0 ]; then
  mapfile -t tags < <(ls "$TREES" | sed -n 's/\.tar\.xz$//p' | sort -V)
fi
for t in "${tags[@]}"; do [ -d "$WORK/$t" ] || tar -xJf "$TREES/$t.tar.xz" -C "$WORK"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
gate() { python3 -m tealite_verify gate "$@"; }
base=${tags[0]}
start=$(date +%s)
[ -s "$OUT/base-$base-cuda.json" ] || timeout ${T_CAPTURE:-300} env -u TRITON_INTERPRET \
  python3 -m tealite_verify gate capture --device cuda --aiter "$WORK/$base" \
  --out "$OUT/base-$base-cuda.json" > "$OUT/capture.log" 2>&1
echo "capture $base: rc=$? $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
one() {  # interpreted, then compiled with the interpreted run as the cross-check
  local t=$1 s
  s=$(date +%s)
  TRITON_INTERPRET=1 timeout ${T_INTERP:-400} python3 -m tealite_verify gate compare \
    --baseline "$OUT/base-$base-cuda.json" --aiter "$WORK/$t" --device cpu \
    --json "$OUT/interp-$t.json" --candidate-out "$OUT/interp-run-$t.json" \
    > "$OUT/interp-$t.log" 2>&1
  local ri=$? ti=$(( $(date +%s) - s ))
  s=$(date +%s)
  local cross=()
  [ -s "$OUT/interp-run-$t.json" ] && cross=(--cross-check "$OUT/interp-run-$t.json")
  env -u TRITON_INTERPRET timeout ${T_COMPILED:-400} python3 -m tealite_verify gate compare \
    --baseline "$OUT/base-$base-cuda.json" --aiter "$WORK/$t" --device cuda "${cross[@]}" \
    --json "$OUT/cuda-$t.json" --markdown "$OUT/cuda-$t.md" > "$OUT/cuda-$t.log" 2>&1
  local rc=$? tc=$(( $(date +%s) - s ))
  echo "$t interpreted rc=$ri ${ti}s compiled rc=$rc ${tc}s" >> "$OUT/times.txt"
}
export -f one
export OUT WORK base T_INTERP T_COMPILED 2>/dev/null
[ "${PINNED:-1}" = 1 ] && printf '%s\n' "${tags[@]}" | xargs -P ${JOBS:-4} -I{} bash -c 'one {}'
if [ "${BUMPS:-0}" = 1 ]; then
  cap() { local t=$1 s; s=$(date +%s)
    [ -s "$OUT/base-$t-cuda.json" ] || env -u TRITON_INTERPRET timeout ${T_CAPTURE:-300} \
      python3 -m tealite_verify gate capture --device cuda --aiter "$WORK/$t" \
      --out "$OUT/base-$t-cuda.json" > "$OUT/capture-$t.log" 2>&1
    echo "capture $t: rc=$? $(( $(date +%s) - s )) s" >> "$OUT/times.txt"; }
  bump() { local prev=$1 t=$2 s; s=$(date +%s)
    env -u TRITON_INTERPRET timeout ${T_COMPILED:-400} python3 -m tealite_verify gate compare \
      --baseline "$OUT/base-$prev-cuda.json" --aiter "$WORK/$t" --device cuda \
      --json "$OUT/bump-$prev-to-$t.json" > "$OUT/bump-$prev-to-$t.log" 2>&1
    echo "bump $prev -> $t: rc=$? $(( $(date +%s) - s )) s" >> "$OUT/times.txt"; }
  export -f cap bump
  printf '%s\n' "${tags[@]}" | xargs -P ${JOBS:-4} -I{} bash -c 'cap {}'
  for i in $(seq 1 $(( ${#tags[@]} - 1 ))); do echo "${tags[$((i-1))]} ${tags[$i]}"; done |
    xargs -P ${JOBS:-4} -L1 bash -c 'bump $0 $1'
fi
python3 - "$OUT" > "$OUT/gate-gpu.md" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| candidate | interpreted exit | compiled exit | compiled: entry points not unchanged |")
print("|---|---|---|---|")
for p in sorted(out.glob("cuda-*.json")):
    t = p.stem[5:]
    c = json.loads(p.read_text())
    i = out / f"interp-{t}.json"
    ie = json.loads(i.read_text()).get("exit_code") if i.exists() else "-"
    eps = {e["entry_point"]: e["verdict"] for e in c.get("entry_points", [])
           if e["verdict"] != "unchanged"}
    print(f"| {t} | {ie} | {c.get('exit_code')} | "
          f"{', '.join(f'{k}: {v}' for k, v in sorted(eps.items())) or 'all unchanged'} |")
bumps = sorted(out.glob("bump-*.json"))
if bumps:
    print()
    print("| bump (compiled) | exit | entry points not unchanged |")
    print("|---|---|---|")
for p in bumps:
    c = json.loads(p.read_text())
    eps = {e["entry_point"]: e["verdict"] for e in c.get("entry_points", [])
           if e["verdict"] != "unchanged"}
    print(f"| {p.stem[5:]} | {c.get('exit_code')} | "
          f"{', '.join(f'{k}: {v}' for k, v in sorted(eps.items())) or 'all unchanged'} |")
EOF
cat "$OUT/times.txt" "$OUT/gate-gpu.md"
