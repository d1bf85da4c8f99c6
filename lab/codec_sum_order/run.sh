#!/usr/bin/env bash
# The codec's bytes under the sequential double sums (commit 2821450, the last with them) against the canonical order
# of tq_sum_canonical (lab/archive/cuda.tar.xz (cuda/v9/README.md)): 2^20 random blocks per format, how many blocks differ.
#   bash lab/codec_sum_order/run.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
git -C "$root" show 2821450:csrc/codec/tq_codec.c > "$w/old_codec.c"
cc=(gcc -std=c11 -O2 -ffp-contract=off -I"$root/csrc/codec")
"${cc[@]}" -c "$w/old_codec.c" -o "$w/old.o"
"${cc[@]}" -c "$root/csrc/codec/tq_codec.c" -o "$w/new.o"
# the old codec's symbols get an old_ prefix so that both link into one program
nm "$w/old.o" | awk '$2 ~ /^[TDRB]$/ {print $3" old_"$3}' > "$w/redef.txt"
objcopy --redefine-syms="$w/redef.txt" "$w/old.o" "$w/old_p.o"
"${cc[@]}" "$root/lab/codec_sum_order/compare.c" "$w/new.o" "$w/old_p.o" -lm -o "$w/compare"
"$w/compare"
