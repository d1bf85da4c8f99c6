#!/usr/bin/env bash
# How FLASH_ATTN_EXT reads TQ V rows, measured side by side (issue 3):
#   vrot: shipped — rows decoded in the rotated domain (s * c'), the weighted sum un-rotated once per query row
#   vrow: rows decoded with the full inverse WHT per row (ggml's to_float), i.e. ggml_tq_fa_v_to_float()
#         returning NULL
# usage: lab/v_read.sh LLAMA_BENCH_VROT LLAMA_BENCH_VROW MODEL   (two builds of llama-bench, e.g. from a dev tree
# built with plain cmake, the second after making ggml_tq_fa_v_to_float return NULL). Prints JSON lines.
set -euo pipefail
rot=$1 row=$2 model=$3
for round in 1 2; do
    for kv in "q8_0 tq3" "tq4 tq4"; do
        read -r k v <<< "$kv"
        for variant in vrot vrow; do
            exe=$rot; [ "$variant" = vrow ] && exe=$row
            "$exe" -m "$model" -t 2 -fa 1 -p 512 -n 64 -d 4096 -r 3 -ctk "$k" -ctv "$v" -o jsonl 2>/dev/null |
                sed "s/^/{\"variant\":\"$variant\",\"round\":$round,\"rec\":/; s/\$/}/"
        done
    done
done
