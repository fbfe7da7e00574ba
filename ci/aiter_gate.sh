#!/usr/bin/env bash
# The AITER version gate on the CPU interpreter path (no GPU, no ROCm needed).
#
#   ci/aiter_gate.sh compare [AITER_PATH]   re-run the committed baseline's cases against the
#                                           installed AITER (the pin in ci/aiter-pin.txt, set up
#                                           by dev.sh) or AITER_PATH (wheel / source tree, e.g.
#                                           ci/aiter_source.sh TAG DIR exports one)
#   ci/aiter_gate.sh capture                re-capture the baseline for the installed AITER
#                                           (commit it together with a reviewed pin bump)
#
# Exit status (compare): 0 pass; 1 AITER's numerics changed or an entry point the project calls
# was removed; 2 the harness could not load or drive (part of) the candidate: a loader or
# adapter problem, an interpreter gap, or bad input.  A report is written in every case.
# docs/aiter.md ("Bumping the pin") is the procedure a reviewer follows.
#
# Reports go to $GATE_OUT (default gate-out/): report.md (the PR comment), report.json and
# candidate.json (the candidate run, usable as the next baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1            # AITER's Triton kernels, interpreted on the CPU
export HYPOTHESIS_PROFILE=ci
BASELINE=${GATE_BASELINE:-ci/baselines/aiter-gate-cpu-interpreter.json}
OUT=${GATE_OUT:-gate-out}
mkdir -p "$OUT"
cmd=${1:-compare}
case "$cmd" in
  capture)
    ./dev.sh py -m tealite_verify gate capture --out "$BASELINE" ;;
  compare)
    aiter_arg=()
    if [ $# -ge 2 ]; then aiter_arg=(--aiter "$2"); fi
    ./dev.sh py -m tealite_verify gate compare --baseline "$BASELINE" "${aiter_arg[@]}" \
      --markdown "$OUT/report.md" --json "$OUT/report.json" \
      --candidate-out "$OUT/candidate.json" ;;
  *) echo "usage: ci/aiter_gate.sh {compare [AITER_PATH]|capture}" >&2; exit 2 ;;
esac
