#!/usr/bin/env bash
# Reproduces the KV cache quality table (bench/results/kv_quality.md): PPL and mean KLD against an f16 base of the
# same run, wikitext-2 test, -c 2048 -b 512 --chunks 16 -fa on -t 2. The protocol (and its checks: >= 3 chunks,
# the Final estimate / Mean PPL(Q) line, eviction rounds when EVICT is set) is `llama-tq ppl`'s; this script only
# names the published settings.
#
#   scripts/ppl_matrix.sh [MODEL.gguf] TEXT
#
# Environment: KV (space- or comma-separated K/V configs), CTX=2048 CHUNKS=16 THREADS=2 OUT=out/ppl_matrix,
#   EVICT (eviction flags for the config runs, e.g. "--triatt-budget 7372"), EXTRA (more llama-perplexity flags).
# Writes $OUT/ppl.json, ppl.csv, kld_vs_bits.png and every log; exit status as `llama-tq ppl` (0 ok, 1 a run broke
# or was INVALID, 2 bad usage).
set -euo pipefail

MODEL=${1:-${MODEL:-}}
TEXT=${2:-${TEXT:-}}
KV=${KV:-"q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3"}
model=()
[[ -n $MODEL ]] && model=(--model "$MODEL") # default: the PyPI Gemma 3 270M

exec llama-tq ppl "${model[@]}" --text "$TEXT" --kv "${KV// /,}" --ctx "${CTX:-2048}" --chunks "${CHUNKS:-16}" \
    --threads "${THREADS:-2}" --evict="${EVICT:-}" --extra="${EXTRA:-}" --out "${OUT:-out/ppl_matrix}"
