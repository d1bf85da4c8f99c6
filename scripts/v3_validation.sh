#!/usr/bin/env bash
# Reproduces the TriAttention V3 validation (bench/results/v3_eviction.md): PPL / KLD with -c 8192 -b 512 --chunks 3
# for f16/f16, q8_0/tq3 and tq3/tq3 without eviction and with V3 at 90 % and 75 % retention, then cloze NIAH at
# 16384 tokens (start / middle / end) without eviction, with V1 and with V3 at 90 %. Every protocol and check is
# `llama-tq v3`'s (an eviction run that logs no round is INVALID); this script only names the published settings.
#
#   scripts/v3_validation.sh [MODEL.gguf] TEXT
#
# Environment: CACHES, CTX=8192 NIAH_CTX=16384 THREADS=2 OUT=out/v3, V3_FLAGS (more --triatt-* flags).
# Writes $OUT/v3.json, v3.md and every run; exit status as `llama-tq v3` (1 if a run broke or was INVALID).
set -euo pipefail

MODEL=${1:-${MODEL:-}}
TEXT=${2:-${TEXT:-}}
CACHES=${CACHES:-"f16/f16 q8_0/tq3 tq3/tq3"}
model=()
[[ -n $MODEL ]] && model=(--model "$MODEL")

exec llama-tq v3 "${model[@]}" --text "$TEXT" --caches "${CACHES// /,}" --ctx "${CTX:-8192}" \
    --niah-ctx "${NIAH_CTX:-16384}" --threads "${THREADS:-2}" --flags "${V3_FLAGS:-}" --out "${OUT:-out/v3}"
