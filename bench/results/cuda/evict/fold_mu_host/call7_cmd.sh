#!/bin/bash
# GPU session 2026-11-26 (sixth), call 7: mu cached on the host for the fold (true_keys); same-machine A/B of the
# fold's thread rule (experiment knobs TQ_EXP_MAXTHR / TQ_EXP_PER in a throw-away build), tq3/tq3 and f16, none
# interleaved. Shipped rule: <= half the threads (8), 32 cells a thread (TQ) / 64 (f16).
export RES=$OUT/r; mkdir -p $RES
W=/root/lt; bin=$W/build/bin
BUILD_TARGETS="llama-perplexity" bash scripts/gpu/run_cuda.sh build || exit 1
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth_ev.gguf" --n-layer 8 --n-embd 1024 \
  --n-head 8 --n-head-kv 4 --n-ctx 8192 --byte-vocab > /dev/null
head -c 40000 .gpu/wiki.test.raw > $W/ev40.txt
run() { # tag proto maxthr per kv (maxthr "none": no eviction)
  local tag=$1 proto=$2 mx=$3 per=$4 kv=${5:-tq3}
  local args=(-c 2048 -b 512 -ub 128 --chunks 16) ev=(--triatt-budget 1024 --triatt-warmup 256 --triatt-divide 64)
  [ "$proto" = defaults ] && args=(-c 8192 -b 512 --chunks 4) && ev=(--triatt-budget 4096)
  [ "$mx" = none ] && ev=() || ev+=(--triatt-hybrid 2)
  TQ_EXP_MAXTHR=${mx/none/0} TQ_EXP_PER=$per $bin/llama-perplexity -m $W/synth_ev.gguf -f $W/ev40.txt "${args[@]}" -fa on -v \
    -ngl 99 -t 16 -ctk $kv -ctv $kv "${ev[@]}" > $RES/cur.log 2>&1
  printf '%-5s %-8s %-4s max %-4s per %-3s %s | %s | %s | round means: %s\n' "$tag" "$proto" "$kv" "$mx" "$per" \
    "$(grep -o 'total time = *[0-9.]* ms' $RES/cur.log)" "$(grep -o 'Final estimate: PPL = [0-9.]*' $RES/cur.log)" \
    "$(grep -o 't_ms=[0-9.]* folded=[0-9]*$' $RES/cur.log | tail -1)" \
    "$(grep -o 'triatt: round .*' $RES/cur.log | awk '{f+=$10; s+=$12; se+=$14; r+=$16; a+=$8; n++} END {if (n) printf "await %.2f fold %.2f score %.2f select %.2f rm %.2f (n %d)", a/n, f/n, s/n, se/n, r/n, n}')"
}
for rep in 1 2 3; do for proto in defaults stress; do
  run rep$rep $proto none 0
  run rep$rep $proto 8 32
  run rep$rep $proto 16 16
  run rep$rep $proto 4 32
  run rep$rep $proto 1 32
  run rep$rep $proto none 0 f16
  run rep$rep $proto 8 64 f16
done; done | tee $RES/fold_rule_ab.txt
rm -f $RES/cur.log
cd $OUT && tar czf r7.tgz r && rm -rf r
