#!/usr/bin/env bash
# The false-alarm campaign (issue 13, docs/false-alarms.md), one command:
#
#   ci/false_alarm_campaign.sh DEVICE CASES SEED [OUT_DIR] [-- EXTRA FUZZ ARGS...]
#
# DEVICE cpu | cuda; CASES the number of fuzz cases wanted (e.g. 1000000); SEED the campaign
# seed.  Runs `python -m tealite_verify fuzz --op all` on every backend available on DEVICE
# (no --backend filter; on the CPU with TRITON_INTERPRET=1, so the interpreted `triton` and
# `aiter_triton` backends are in), stopped by `--max-cases CASES`, with a fresh corpus in
# OUT_DIR (never the repository's findings/).  Writes into OUT_DIR (default
# false-alarms-DEVICE-SEED): report.json + report.md (the fuzz reports), campaign.json +
# campaign.md (command, machine, cases, cases/s, findings), list.txt (backends and what was
# probed on this machine), fuzz.log, corpus/ (findings, if any).
#
# Exit status: 0 = CASES reached, 0 findings; 1 = findings (a false alarm or a backend bug:
# each must be analysed); 3 = the time cap came first (fewer cases than asked); 2 = bad
# arguments or the fuzz could not start; 130 = interrupted.
#
# Environment: WORKERS (default: every core on cpu, every core but one on cuda), MAX_MINUTES
# (time cap, default 1440), INTERPRET=0 (cpu: leave the interpreted Triton backends out),
# OPS (space-separated ops instead of all: for smoke tests), PYTHON (default .venv/bin/python
# if present, else python3), ONEDNN_MAX_CPU_ISA (passed through: run the CPU campaign on both
# oneDNN paths, unrestricted and AVX2).
set -uo pipefail
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 3 ] || usage
DEVICE=$1 CASES=$2 SEED=$3
shift 3
OUT=false-alarms-$DEVICE-$SEED
if [ $# -gt 0 ] && [ "$1" != "--" ]; then OUT=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
case $DEVICE in cpu|cuda) ;; *) echo "error: DEVICE must be cpu or cuda, got '$DEVICE'" >&2; exit 2;; esac
[[ $CASES =~ ^[1-9][0-9]*$ ]] || { echo "error: CASES must be a positive integer, got '$CASES'" >&2; exit 2; }
[[ $SEED =~ ^[0-9]+$ ]] || { echo "error: SEED must be a non-negative integer, got '$SEED'" >&2; exit 2; }
MAX_MINUTES=${MAX_MINUTES:-1440}
[[ $MAX_MINUTES =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "error: MAX_MINUTES must be a number, got '$MAX_MINUTES'" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1
if [ "$DEVICE" = cpu ] && [ "${INTERPRET:-1}" != 0 ]; then export TRITON_INTERPRET=1; fi

ARGS=(--device "$DEVICE" --seed "$SEED" --max-cases "$CASES" --minutes "$MAX_MINUTES"
      --corpus "$OUT/corpus" --json "$OUT/report.json" --markdown "$OUT/report.md")
for op in ${OPS:-all}; do ARGS+=(--op "$op"); done
if [ -n "${WORKERS:-}" ]; then ARGS+=(--workers "$WORKERS")
elif [ "$DEVICE" = cpu ]; then ARGS+=(--workers "$(nproc 2>/dev/null || echo 1)")
else
  # The GPU is mostly idle: a case's harness work is CPU work.  On the H100 host (16 cores)
  # 4 workers ran 157-189 cases/s, 12 ran 367 and 15 ran 450-539 (docs/false-alarms.md).
  N=$(nproc 2>/dev/null || echo 2); ARGS+=(--workers "$(( N > 1 ? N - 1 : 1 ))")
fi
ARGS+=("$@")
COMMAND="ci/false_alarm_campaign.sh $DEVICE $CASES $SEED"
[ $# -gt 0 ] && COMMAND+=" -- $*"

rm -f "$OUT/report.json"
"$PYTHON" -m tealite_verify list > "$OUT/list.txt" 2>&1
echo "[campaign] $PYTHON -m tealite_verify fuzz ${ARGS[*]}" | tee "$OUT/fuzz.log" >&2
"$PYTHON" -m tealite_verify fuzz "${ARGS[@]}" 2>&1 | tee -a "$OUT/fuzz.log" | grep -v '^\[fuzz\] [0-9]*:[0-9]* elapsed' >&2
RC=${PIPESTATUS[0]}
if [ ! -s "$OUT/report.json" ]; then
  echo "error: the fuzz wrote no report (exit status $RC); see $OUT/fuzz.log" >&2
  exit $(( RC == 130 ? 130 : 2 ))
fi
"$PYTHON" ci/false_alarm_summary.py --report "$OUT/report.json" --out "$OUT" \
  --device "$DEVICE" --cases "$CASES" --seed "$SEED" --fuzz-status "$RC" \
  --command "$COMMAND"
