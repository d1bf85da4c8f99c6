#!/usr/bin/env bash
# Needle-in-a-haystack under TriAttention eviction (issue 15): for each context length, needle set and policy, the
# strict cloze NIAH of `llama-tq niah` (llama-completion -no-cnv --no-display-prompt --temp 0, case-sensitive
# PASS / PARTIAL_WORD / PARTIAL_NUMBER / FAIL) at POSITIONS, f16 cache, prompt decoded in -b 512 batches so that
# rounds run during the prefill; the round lines in each log confirm the eviction. Ends with a table of all runs.
#
#   scripts/niah_eviction.sh [WIKI]     (WIKI: the second haystack, default ../shared/data/wikitext-2-raw/wiki.test.raw)
#
# Environment: CTXS="8192", POLICIES="none v3@75 v3@50 v3@25 streaming@50" (policy@budget-percent; v1, v2, v3,
#   streaming, random), POSITIONS="0.1,0.3,0.5,0.7,0.9", THREADS=2, OUT=out/niah_eviction, SETS="A B",
#   EXTRA (more flags for the eviction runs, e.g. --triatt-window 1024) with TAG (appended to their folder names).
# Needle sets: A = the default needle in the default haystack (Python's pydoc topics), B = another needle in WIKI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
WIKI=${1:-$root/../shared/data/wikitext-2-raw/wiki.test.raw}
OUT=${OUT:-out/niah_eviction}
for ctx in ${CTXS:-8192}; do
    for set in ${SETS:-A B}; do
        needle=()
        [[ $set == B ]] && needle=(--text "$WIKI" --needle "The password for the blue door is 5193." --answer 5193)
        for pol in ${POLICIES:-none v3@75 v3@50 v3@25 streaming@50}; do
            extra="-b 512"
            if [[ $pol != none ]]; then
                name=${pol%@*} pct=${pol#*@}
                extra+=" --triatt-budget $((ctx * pct / 100)) --triatt-policy $name --triatt-warmup 1024"
                extra+=" ${EXTRA:-}"
            fi
            echo "== ctx $ctx set $set policy $pol: $extra"
            llama-tq niah "${needle[@]}" --kv f16/f16 --ctx "$ctx" --positions "${POSITIONS:-0.1,0.3,0.5,0.7,0.9}" \
                --threads "${THREADS:-2}" --extra="$extra" --out "$OUT/${ctx}_${set}_${pol/@/_}$([[ $pol != none ]] && echo "${TAG:-}")"
        done
    done
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
short = {"PASS": "PASS", "PARTIAL_WORD": "P_WORD", "PARTIAL_NUMBER": "P_NUM", "FAIL": "FAIL"}
print("| ctx | set | policy @ budget | rounds/run | results by position | PASS |")
print("|---|---|---|---|---|---|")
runs = [(f, *f.parent.name.split("_", 2)) for f in Path(sys.argv[1]).glob("*/niah.json")]
for f, ctx, st, pol in sorted(runs, key=lambda r: (int(r[1]), r[2], r[3] != "none", r[3])):
    res = json.loads(f.read_text())["results"]
    ev = sorted({r["evictions"] for r in res if r["evictions"] is not None})
    name, pct, tag = (pol.split("_", 2) + ["", ""])[:3]  # policy_percent[_TAG]
    name = name if pol == "none" else f"{name} @ {pct} %" + (f" ({tag})" if tag else "")
    cells = " ".join(f"{r['position']}:{short[r['status']]}" for r in res)
    n = sum(r["status"] == "PASS" for r in res)
    print(f"| {ctx} | {st} | {name} | {'/'.join(map(str, ev)) or '-'} | {cells} | {n}/{len(res)} |")
PY
