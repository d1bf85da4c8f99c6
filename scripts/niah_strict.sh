#!/usr/bin/env bash
# Reproduces the demo's needle-in-a-haystack columns (README, bench/results/demo/): cloze NIAH with the needle at
# start / middle / end of a CTX-token prompt (measured with the model's tokenizer), llama-completion
# -no-cnv --no-display-prompt --temp 0, checked case-sensitively on the generated text only: PASS / PARTIAL_WORD /
# PARTIAL_NUMBER / FAIL. Prompt building and the checker are `llama-tq niah`'s; this script only names the settings.
#
#   scripts/niah_strict.sh [MODEL.gguf] [TEXT]     (TEXT default: the demo's embedded Python reference text)
#
# Environment: KV (K/V configs), CTX=1024 THREADS=2 OUT=out/niah_strict, POSITIONS="start,middle,end",
#   EXTRA (more llama-completion flags, e.g. eviction), REQUIRE_PASS=1 (exit 1 unless every run PASSes).
# Writes $OUT/niah.json, niah.png and every log; exit status as `llama-tq niah`.
set -euo pipefail

MODEL=${1:-${MODEL:-}}
TEXT=${2:-${TEXT:-}}
KV=${KV:-"f16/f16 q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3"}
args=()
[[ -n $MODEL ]] && args+=(--model "$MODEL")
[[ -n $TEXT ]] && args+=(--text "$TEXT")
[[ ${REQUIRE_PASS:-0} == 1 ]] && args+=(--require-pass)

exec llama-tq niah "${args[@]}" --kv "${KV// /,}" --ctx "${CTX:-1024}" --positions "${POSITIONS:-start,middle,end}" \
    --threads "${THREADS:-2}" --extra="${EXTRA:-}" --out "${OUT:-out/niah_strict}"
