#!/usr/bin/env bash
# Issue 47 gate 3 on the GPU: the tq3a key type's CUDA kernels checked, then the 40-cell NIAH grids of the built type
# on the grid's own prompts (lab/key_alloc_grid.sh), and llama-perplexity GPU against CPU.
#   here:  PIECE=55M scripts/gpu/pack.sh; bash lab/key_alloc_grid.sh prepare archived
#          llama-tq calibrate --tokens 2048 -o out/tq3a/gemma3-270m.tqcal   (the haystack's first 2048 tokens)
#   GPU:   the model pieces over several calls into $WORK (/root/lt), as run_cuda.sh's niah stage joins them; then
#          bash lab/tq3a_gpu.sh check        build, exactness (tests/cuda: tq3a among the types), test-backend-ops
#                                            of the tq3a cases
#          bash lab/tq3a_gpu.sh grid CTX     the grid at CTX for KV (default tq3a/tq3); results in $RES, packed into
#                                            grid_CTX.tar.gz (the device tool returns 8 files)
#          bash lab/tq3a_gpu.sh ppl          wikitext-2, -c 2048 --chunks 8: tq3a/tq3 and tq3/tq3, GPU and CPU
#          bash lab/tq3a_gpu.sh decode       llama-bench tg128 at depths 0 and 16384, K tq3 / tq3a / f16 (V tq3; f16
#                                            with f16), two rounds in alternating order (needs the llama-bench target)
#          bash lab/tq3a_gpu.sh synth        tq3a decode without carrying the model: build, test-backend-ops FLASH_ATTN_EXT
#                                            tq3a cases (CUDA vs CPU), then llama-bench tg128 at depths 0 and 16384 of a
#                                            head-256 synthetic model (18 layers, 1024, 4/1 heads, generated here) with the
#                                            calibration .gpu/h256/m.tqcal (python lab/tq3a_synth_cal.py): tq3/tq3,
#                                            tq3a/tq3, f16/f16, two rounds in alternating order; synth.md
#   then:  python bench/niah_grid.py <results> (bench/results/key_allocation.md)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export RES=${RES:-${OUT:-out/cuda}}
W=${WORK:-/root/lt}
cal=$PWD/out/tq3a/gemma3-270m.tqcal
mkdir -p "$RES" "$W"
case ${1:-} in
    check)
        BUILD_TARGETS="test-backend-ops llama-completion llama-tokenize llama-perplexity" \
            scripts/gpu/run_cuda.sh build exact || exit 1
        OPS_P=tq3a scripts/gpu/run_cuda.sh ops
        ;;
    grid)
        ctx=${2:?usage: lab/tq3a_gpu.sh grid CTX}
        NIAH_EXTRA="--tq-keys-cal $cal" KV=${KV:-tq3a/tq3} bash lab/key_alloc_grid.sh run "$ctx"
        rc=$?
        (cd "$RES" && tar czf "grid_$ctx.tar.gz" niah_"$ctx"_* && rm -rf niah_"$ctx"_*)
        exit "$rc"
        ;;
    ppl)
        cp -n .gpu/model.part* "$W"/ 2> /dev/null
        cat "$W"/model.part* > "$W/model.gguf"
        for kv in tq3a/tq3 tq3/tq3 f16/f16; do
            for ngl in 99 0; do
                log="$RES/ppl_${kv/\//_}_ngl$ngl.log"
                "$W/build/bin/llama-perplexity" -m "$W/model.gguf" -f .gpu/wiki.test.raw -c 2048 -b 512 --chunks 8 \
                    -fa on -ctk "${kv%/*}" -ctv "${kv#*/}" -ngl "$ngl" -t "$(nproc)" --tq-keys-cal "$cal" > "$log" 2>&1
                printf 'ppl %-9s ngl %-2s %s\n' "$kv" "$ngl" "$(grep 'Final estimate' "$log")"
            done
        done
        ;;
    decode)
        cp -n .gpu/model.part* "$W"/ 2> /dev/null
        cat "$W"/model.part* > "$W/model.gguf"
        for order in "tq3 tq3a f16" "f16 tq3a tq3"; do
            for k in $order; do
                v=$([ "$k" = f16 ] && echo f16 || echo tq3)
                "$W/build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -fa 1 -ctk "$k" -ctv "$v" -p 0 -n 128 \
                    -d 0,16384 -r 3 -o md --tq-keys-cal "$cal" 2>> "$RES/decode.err" | grep -E "tg128" | tee -a "$RES/decode.md"
            done
        done
        ;;
    synth)
        [ -x "$W/build/bin/llama-bench" ] || BUILD_TARGETS="test-backend-ops llama-bench" scripts/gpu/run_cuda.sh build ||
            exit 1
        "$W/build/bin/test-backend-ops" test -b CUDA0 -o FLASH_ATTN_EXT -p tq3a > "$RES/ops_fa_tq3a.log" 2>&1
        grep -E 'tests passed|FAIL' "$RES/ops_fa_tq3a.log" | tail -3
        m=$W/h256.gguf
        [ -f "$m" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$m" --n-layer 18 \
            --n-embd 1024 --n-head 4 --n-head-kv 1 --n-ff 2048 --n-ctx 32768 --byte-vocab > /dev/null || exit 1
        : > "$RES/synth.md"
        for order in "tq3 tq3a f16" "f16 tq3a tq3"; do
            for k in $order; do
                v=$([ "$k" = f16 ] && echo f16 || echo tq3)
                "$W/build/bin/llama-bench" -m "$m" -ngl 99 -fa 1 -ctk "$k" -ctv "$v" -p 0 \
                    -n 128 -d 0,16384 -r 3 -o md --tq-keys-cal .gpu/h256/m.tqcal 2>> "$RES/synth.err" |
                    grep -E "tg128" | sed "s/^/$k /" | tee -a "$RES/synth.md"
            done
        done
        ;;
    *)
        sed -n '2,20p' "$0" >&2
        exit 2
        ;;
esac
