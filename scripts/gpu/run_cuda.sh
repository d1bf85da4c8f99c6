#!/usr/bin/env bash
# Builds, tests and benchmarks llama-tq's CUDA kernels on a GPU machine, from what scripts/gpu/pack.sh put in
# .gpu/. Stages (default: all), each writing its log/results into $RES (default $OUT, else out/cuda: git-ignored; curated tables are copied to bench/results by hand):
#   build  patched llama.cpp (sm_90 unless CUDA_ARCH is set): test-backend-ops, llama-bench, llama-perplexity
#   exact  GPU quantizer vs the C codec, byte for byte, on 2^20 random blocks per type, and the prefill converter vs
#          the GPU dequantizer, bit for bit (tests/cuda)
#   convert  the prefill converter (TQ -> f16 of a whole cache) against a device copy (lab/cuda/tq_convert_bench.cu)
#   ops    test-backend-ops test -b CUDA0 for every TQ case of SET_ROWS, GET_ROWS, CPY, MUL_MAT, FLASH_ATTN_EXT
#   perf   test-backend-ops perf of FLASH_ATTN_EXT decode/prefill, all KV types side by side (heads 128 and 256)
#   kernel the standalone decode harness (lab/cuda/fa_decode_bench.cu): SIMT vs tensor-core kernel vs C codec
#   kernel_ab  the harness as shipped and with the lab patch KERNEL_PATCH and/or nvcc flags KERNEL_DEFINES (e.g.
#          -DTQ_MMA_MIN_BLOCKS=5): the variant's correctness, then interleaved perf rounds of the TQ pairs
#   vstep  the tensor-core kernel's V step alone, shipped vs decoded to shared memory (lab/cuda/v_step_bench.cu)
#   ppl    llama-perplexity on the default model, CPU and GPU, f16 and tq3/tq3 (model pieces joined first)
#   niah   `llama-tq niah` on the default model on the GPU (NIAH_CTX, NIAH_KV, NIAH_POS, NIAH_NEEDLES; NIAH_TEXT: a
#          haystack file, e.g. the one the CPU runs used: the default, pydoc topics, follows the Python version;
#          NIAH_EXTRA: more tool flags, e.g. --tq-keys-cal FILE for tq3a keys)
#   bench  llama-bench on a synthetic 8-layer head-128 model, f16/q8_0/q4_0/tq4/tq3 in one run; llama_bench_ratios.md:
#          each round's t/s ratio to the same round's f16 (repeat the types in BENCH_TYPES to interleave rounds)
#   summary summary.json from the perf and bench stages' logs (scripts/gpu/summary.py)
#   bandwidth fa_bandwidth.md: each FA decode case's KV read rate against the device copy (perf and convert stages'
#          logs, scripts/gpu/fa_bandwidth.py)
#   evict  TriAttention eviction on the GPU and on the CPU (-ngl 99 / 0): a head-128 synthetic model with a byte
#          vocabulary, -c 2048 -b 512 -ub 128, V3 / StreamingLLM at 50 %: rounds, cells evicted, PPL, wall time; then
#          the overhead stage
#   overhead  V3 eviction against none, interleaved, GPU and CPU, two protocols (EV_PROTOS, EV_NGL, EV_REPS, EV_TAG,
#          EV_KV: cache-type flags, default f16)
#   evict8b  TriAttention overhead where users run it (issue 46): the 8B shape (32 layers, 4096, 32/8 heads, head 128,
#          byte vocabulary), on the GPU, caches EV8_KV (f16 tq3), EV8_REPS interleaved rounds (default 2) of:
#          llama-perplexity -c 8192 --chunks 4 -ub 512 (none / V3 / V3 with rounds at once: LLAMA_TQ_TRIATT_LATE_DISABLE=1)
#          and -ub 128 (none / V3), budget 4096; llama-completion decode, 4096-byte prompt, 512 tokens generated at
#          budget 2048 (a round every 128 tokens); evict8b.txt (each run, then the ratios: scripts/gpu/evict8b.py);
#          EV8_PROTOS picks protocols (ub512 ub128 decode)
#   gathercheck  the device gather of a ubatch's keys against copying ranges of rows (LLAMA_TQ_TRIATT_DEVICE_GATHER_DISABLE=1):
#          the 8B shape, f16 and tq3, -ub 512, budget 4096: every round's kept positions (their hash, -v) must match
#   calibcheck  calibration's query sums on threads behind the device against in the scheduler's callback
#          (LLAMA_TQ_TRIATT_ASYNC_CAPTURE_DISABLE=1): the 8B shape, CC_KV (f16), -ub 512, budget 4096, CC_REPS (2)
#          interleaved rounds of none / async / sync: each round's kept positions and PPL must match; time ratios
#   head64 head-size-64 synthetic model (8 layers, 32 heads, 8 KV heads, byte vocabulary): FA decode perf of
#          f16/q8_0/q4_0/tq4_64/tq3_64, llama-bench tg/pp at H_DEPTHS with -ctk/-ctv tq3 etc. (tq3 -> tq3_64 by
#          libllama), llama-perplexity KLD vs the GPU f16 run for q4_0 and tq3/tq4 on the GPU and tq3 on the CPU
#   head96 the same at head size 96 (tq3 -> tq3_96; decoded by upstream's f16 kernels after a conversion)
# Environment: OPS (ops stage op list), OPS_P (its case filter, default tq[34]), H_TYPES / H_DEPTHS (head stages), BENCH_TYPES and PPL_RUNS (a type, or type@nokeys for --tq-keys 0),
#   BENCH_DEPTHS, BENCH_REPS, KERNEL_MODE=perf, CUDA_ARCH, BUILD_TARGETS (build stage's ninja targets),
#   CMAKE_EXTRA (more cmake arguments, e.g. -DCMAKE_CUDA_FLAGS=-DTQ_STAMPS after `bash lab/patch.sh apply cuda-stamps`).
#   profile per-kernel GPU time of decode steps (ncu over llama-bench tg, CUDA graph nodes), per K/V pair;
#          NCU_EXTRA adds ncu flags ("--cache-control none --clock-control none": warm caches, boost clocks)
#   graphppl  llama-perplexity with the TQ decode kernels in real graphs (ubatches of 1, 8, 128): GPU vs CPU
#   ncu    Nsight Compute on one tq3 decode launch of the 4-sequence case (speed of light, occupancy)
#   ncu_kernel  Nsight Compute on the harness's tensor-core kernel (no llama.cpp build): stall reasons, occupancy,
#          memory throughput of the 4 x 8 and 1 x 4 x 32K tq3/tq3 cases; KERNEL_DEFINES as kernel_ab's
#   multigpu  two GPUs with TQ caches (issue 43): llama-perplexity of a head-128 synthetic model, -sm none / layer / tensor
#          (f16, tq3; -sm row: the pinned CUDA backend has no split buffers, f16 included), llama-bench pp512 / tg128
#          of the 8B shape at depths 0 and 32768 with each split
#   keymean  the per-sequence key means: tq3 KLD on the GPU against the CPU's, with 1 and 4 sequences
#   rpc    llama.cpp's RPC backend with TQ caches: a CUDA ggml-rpc-server on loopback, the client seeing no local GPU
#          (-ngl 99 puts the layers and their KV cache on the remote device); PPL against the local GPU run
#   kbias  a K bias before RoPE (Qwen2, issue 44): 4-layer qwen2 synthetic models (head 128, byte vocabulary) without
#          and with a bias 10x the key norm on all / slow / fast RoPE pairs; KLD against the GPU f16 run at -c 1024 and
#          16384 for every cache type, tq3 / tq4 also with LLAMA_TQ_KEY_BIAS_DISABLE=1 (the bias kept in the keys);
#          GPU against CPU (-ub 512: f16 keys with the bias added; -ub 8: the per-head mask); kbias.tsv
#   kbdecode the K bias's term in the decode shape: test-backend-ops TQ_KEY_BIAS_MASK (the mask chain, CUDA vs CPU),
#          tq3/tq3 KLD against f16 at -ub 1 (one query row) and 8, one stream and four sequences in one unified stream,
#          GPU and CPU; KB_VARIANT_ENV (e.g. LLAMA_TQ_CUDA_KEY_BIAS_FUSE_DISABLE=1 with lab/patches/key-bias-fuse.patch)
#          adds a GPU run with that environment; kbdecode.tsv
#   kbtrace  a decode step's kernels with and without the K bias (CUPTI trace, 8B shape, tq3, d0 and d32768)
#   kbias8b  the 8B shape as qwen2 with and without a K bias: llama-bench tg128 / pp512 (KB_P) at depths 0 and 32768
#          (KB_DEPTHS), KB_TYPES (f16 tq3 tq4), with the bias also under KB_VARIANT_ENV if set, rounds interleaved
#          (KB_REPS), kbias8b.md
#   llama8b  the shape users run (issue 45): an 8B-shaped synthetic model (32 layers, 4096, 32/8 heads, head 128, Q8_0),
#          llama-bench pp512 / tg128 at depths 0 and 32768 (L8_DEPTHS) for L8_TYPES (f16 q8_0 q4_0 tq4 tq3 tq4/tq3),
#          L8_REPS interleaved rounds (default 2), llama8b.md; then llama8b_table.md and summary.json's "llama8b"
#          (scripts/gpu/llama8b.py: each round's ratio to the same round's f16, every issue-45 target met or not)
#   llama8b_long  the same at depth 131072 (L8_LONG_P prompt tokens, default 512; one round, ~1.5 min a type:
#          split L8_TYPES over calls, L8_APPEND=1 keeps the file), llama8b_long.md
#   llama8b_perf  test-backend-ops perf of FA decode, 1 sequence x 4 KV heads and 4 x 8, GQA 4, KV 32K and 128K, heads
#          128 and 256, the six pairs (fa_perf_llama8b.log; L8_PERF_KV: 32768, 131072 or both, ~20 s a case, 17 min
#          for all 48 on an H200), the convert stage's device copy for the read rates
#   usage: scripts/gpu/run_cuda.sh [stage ...]
# shellcheck disable=SC2317,SC2329  # the stage_* functions are called by name
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
RES=${RES:-${OUT:-out/cuda}}
W=${WORK:-/root/lt}
ARCH=${CUDA_ARCH:-90}
mkdir -p "$RES" "$W"
bin="$W/build/bin"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build exact ops perf kernel ppl bench ncu)
fail=0

note() { printf '== %s\n' "$*" | tee -a "$RES/run.log"; }

stage_build() {
    rm -rf "$W/src" && mkdir -p "$W/src" && tar xzf .gpu/llama-tq-src.tar.gz -C "$W/src" || return 1
    local commit
    commit=$(sed -n 's/^LLAMA_CPP_COMMIT=//p' patches/base.env | cut -c1-7) # the pin's one home
    # shellcheck disable=SC2086  # CMAKE_EXTRA: a list
    cmake -S "$W/src" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DCMAKE_PROJECT_INCLUDE="$PWD/cmake/no_amx.cmake" \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON -DLLAMA_BUILD_COMMIT="$commit" ${CMAKE_EXTRA:-} \
        > "$RES/build.log" 2>&1 ||
        return 1
    # shellcheck disable=SC2086  # BUILD_TARGETS: a list
    /usr/bin/time -f "build wall %e s" ninja -C "$W/build" -j"$(nproc)" \
        ${BUILD_TARGETS:-test-backend-ops llama-bench llama-perplexity llama-completion llama-tokenize ggml-rpc-server} \
        >> "$RES/build.log" 2>&1
    local rc=$?
    tail -1 "$RES/build.log"
    return "$rc"
}

# the C codec as an object for the standalone GPU programs (the reference they check against)
codec_obj() { gcc -O2 -std=c11 -ffp-contract=off -c csrc/codec/tq_codec.c -o "$W/tq_codec.o"; }

# the decode harness (lab/cuda/fa_decode_bench.cu) against the csrc under SRC, as $W/NAME, more nvcc flags after
fa_bench() { # SRC NAME [FLAG ...]
    local src=$1 name=$2
    shift 2
    nvcc -O3 -arch=sm_"$ARCH" -use_fast_math -std=c++17 "$@" -I"$src/csrc/codec" \
        -I"$src/csrc/llama.cpp/ggml/src/ggml-cuda/tq" lab/cuda/fa_decode_bench.cu "$W/tq_codec.o" -o "$W/$name"
}

stage_exact() {
    codec_obj || return 1
    nvcc -O2 -arch=sm_"$ARCH" -use_fast_math -std=c++17 -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
        tests/cuda/tq_quant_exact.cu \
        "$W/tq_codec.o" -o "$W/tq_quant_exact" || return 1
    "$W/tq_quant_exact" 1048576 | tee "$RES/quant_exact.txt"
}

stage_convert() { # the prefill converter's speed (lab/cuda/tq_convert_bench.cu); exactness is stage_exact's
    codec_obj || return 1
    nvcc -O3 -std=c++17 -arch=sm_"$ARCH" -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
        lab/cuda/tq_convert_bench.cu "$W/tq_codec.o" -o "$W/tq_convert_bench" || return 1
    "$W/tq_convert_bench" | tee "$RES/convert_bench.txt"
}

stage_ops() {
    local rc=0 op
    for op in ${OPS:-SET_ROWS GET_ROWS CPY MUL_MAT FLASH_ATTN_EXT}; do
        "$bin/test-backend-ops" test -b CUDA0 -o "$op" -p "${OPS_P:-tq[34]}" > "$RES/ops_$op.log" 2>&1 || rc=1
        printf '%-15s %s\n' "$op" "$(grep -E 'tests passed|Backend CUDA0' "$RES/ops_$op.log" | tail -1)"
        grep -c 'FAIL' "$RES/ops_$op.log" | xargs printf '%-15s FAIL lines: %s\n' "$op"
    done
    return "$rc"
}

stage_perf() {
    "$bin/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT \
        -p 'hsk=128,hsv=128,nh=(4,nr23=\[4,1\],kv=32768|8,nr23=\[4,4\]|8,nr23=\[4,1\],kv=8192,nb=512,)|hsk=256,hsv=256,nh=8,nr23=\[4,4\]' \
        > "$RES/fa_perf.log" 2>&1
    local rc=$?
    grep -E 'FLASH_ATTN_EXT' "$RES/fa_perf.log" | sed 's/  */ /g'
    return "$rc"
}

stage_kernel() {
    codec_obj || return 1
    fa_bench "$PWD" fa_decode_bench || return 1
    local mode=()
    [ -n "${KERNEL_MODE:-}" ] && mode=("$KERNEL_MODE") # "perf": skip the correctness cases
    "$W/fa_decode_bench" "${mode[@]}" | tee "$RES/fa_decode_bench.txt" | grep -v ' ok$'
}

stage_kernel_ab() { # the harness of csrc as shipped against a variant: csrc with the lab patch KERNEL_PATCH and/or
    # built with KERNEL_DEFINES (nvcc flags, e.g. -DTQ_MMA_MIN_BLOCKS=5); the variant's correctness cases, then the
    # TQ-pair perf cases of both, interleaved (KERNEL_AB_REPS rounds, ~40 s a run on an H200); fa_decode_ab.txt
    local name=${KERNEL_PATCH:-} ab="$W/ab" r v defs=()
    read -ra defs <<< "${KERNEL_DEFINES:-}"
    [ -n "$name" ] || [ ${#defs[@]} -gt 0 ] || { echo "kernel_ab: set KERNEL_PATCH and/or KERNEL_DEFINES" >&2; return 1; }
    codec_obj || return 1
    rm -rf "$ab" && mkdir -p "$ab" && cp -r csrc "$ab/" || return 1
    if [ -n "$name" ]; then patch -s -p1 -d "$ab" < "lab/patches/$name.patch" || return 1; fi
    for v in shipped variant; do
        local src=$PWD extra=()
        [ "$v" = shipped ] || { src=$ab; extra=("${defs[@]}"); }
        fa_bench "$src" "fa_decode_bench_$v" "${extra[@]}" || return 1
    done
    echo "variant: ${name:-no patch} ${defs[*]}" | tee "$RES/fa_decode_ab.txt"
    "$W/fa_decode_bench_variant" > "$RES/fa_decode_ab_correctness.txt" || { grep -v ' ok$' "$RES/fa_decode_ab_correctness.txt"; return 1; }
    tail -1 "$RES/fa_decode_ab_correctness.txt"
    for r in $(seq "${KERNEL_AB_REPS:-2}"); do
        for v in shipped variant; do
            echo "== $v round $r" >> "$RES/fa_decode_ab.txt"
            "$W/fa_decode_bench_$v" perf tq >> "$RES/fa_decode_ab.txt" || return 1
        done
    done
    grep -E '^==|mma' "$RES/fa_decode_ab.txt" | sed 's/| ok //; s/softcap  0.0 //'
}

stage_vstep() { # issue 45: is the V step's index spreading worth replacing? (the harness's header has the prediction)
    codec_obj || return 1
    nvcc -O3 -std=c++17 -arch=sm_"$ARCH" -use_fast_math -Icsrc/codec -Icsrc/llama.cpp/ggml/src/ggml-cuda/tq \
        lab/cuda/v_step_bench.cu "$W/tq_codec.o" -o "$W/v_step_bench" || return 1
    "$W/v_step_bench" | tee "$RES/v_step_bench.txt"
}

# The default model, joined from the pieces pack.sh made (carried now, or left in $W by an earlier command).
join_model() {
    local model="$W/model.gguf"
    if [ ! -f "$model" ]; then
        cat "$W"/model.part* > "$model" 2>/dev/null || cat .gpu/model.part* > "$model"
    fi
    [ "$(sha256sum "$model" | cut -d' ' -f1)" = "$(cat .gpu/model.sha256)" ] || { echo "model pieces incomplete"; return 1; }
}

stage_ppl() {
    local model="$W/model.gguf"
    join_model || return 1
    local run kv ngl log rc=0
    for run in ${PPL_RUNS:-f16 tq3 tq3@nokeys}; do
        kv=${run%@nokeys} # "@nokeys": --tq-keys 0 (no key transforms)
        for ngl in 99 0; do
            log="$RES/ppl_${run/@/_}_ngl$ngl.log" # no '@' in file names: the device tool refuses them
            "$bin/llama-perplexity" -m "$model" -f .gpu/wiki.test.raw -c 2048 -b 512 --chunks 8 -fa on \
                -ctk "$kv" -ctv "$kv" -ngl "$ngl" -t "$(nproc)" --tq-keys "$([ "$kv" = "$run" ] && echo auto || echo 0)" \
                > "$log" 2>&1 || rc=1
            printf 'ppl %-11s ngl %-2s %s\n' "$run" "$ngl" "$(grep 'Final estimate' "$log")"
        done
    done
    return "$rc"
}

stage_niah() {
    join_model || return 1
    # the harness runs the tools of its package's bin/ (relinked only when it differs: a stage running beside this
    # one reads it, and ln -sfn replaces the link non-atomically)
    [ "$(readlink python/llama_tq/bin)" = "$bin" ] || ln -sfn "$bin" python/llama_tq/bin
    if ! python3 -c 'import sys; sys.path.insert(0, "python"); import llama_tq._codec' 2> /dev/null; then
        gcc -O2 -std=c11 -ffp-contract=off -fPIC -c csrc/codec/tq_codec.c -o "$W/tq_codec_pic.o" || return 1
        local inc
        read -ra inc <<< "$(python3 -m pybind11 --includes)"
        g++ -O2 -std=c++17 -shared -fPIC "${inc[@]}" -Icsrc/codec csrc/python/tq_pymodule.cpp \
            "$W/tq_codec_pic.o" -o "python/llama_tq/_codec$(python3-config --extension-suffix)" || return 1
    fi
    # NIAH_PAR=1: every (context, needle) grid as its own process at once (the small model leaves the GPU idle)
    local ctx needle i=0 rc=0 pids=() names=() j
    for ctx in ${NIAH_CTX:-16384}; do
        while IFS= read -r needle; do
            i=$((i + 1))
            # shellcheck disable=SC2086  # NIAH_TEXT: absent or one path
            PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq niah --model "$W/model.gguf" --ctx "$ctx" \
                --kv "${NIAH_KV:-f16/f16,tq3/tq3}" --positions "${NIAH_POS:-start,middle,end}" --needle "$needle" \
                ${NIAH_TEXT:+--text "$NIAH_TEXT"} -t 4 --extra="-ngl 99${NIAH_EXTRA:+ $NIAH_EXTRA}" --out "$RES/niah_${ctx}_$i" \
                > "$RES/niah_${ctx}_$i.txt" 2>&1 &
            pids+=($!) names+=("niah_${ctx}_$i")
            [ "${NIAH_PAR:-0}" = 1 ] || { wait "${pids[-1]}" || rc=1; }
        done <<< "${NIAH_NEEDLES:-The secret code word is PURPLE ELEPHANT 7742.}"
    done
    for j in "${!pids[@]}"; do
        [ "${NIAH_PAR:-0}" = 1 ] && { wait "${pids[$j]}" || rc=1; }
        echo "${names[$j]}"
        sed -n '/^config/,$p' "$RES/${names[$j]}.txt"
    done
    return "$rc"
}

stage_bench() {
    PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null || return 1
    local run t rc=0
    : > "$RES/llama_bench.md"
    for run in ${BENCH_TYPES:-f16 q8_0 q4_0 tq4 tq3 tq3@nokeys}; do
        t=${run%@nokeys} # "@nokeys": --tq-keys 0 (no key transforms)
        [ "$t" != "$run" ] && echo "--tq-keys 0:" | tee -a "$RES/llama_bench.md"
        "$bin/llama-bench" -m "$W/synth.gguf" -ngl 99 -fa 1 -p 512 -n 128 -d "${BENCH_DEPTHS:-0,8192,32768}" \
            -r "${BENCH_REPS:-10}" --tq-keys "$([ "$t" = "$run" ] && echo auto || echo 0)" \
            -ctk "$t" -ctv "$t" -o md 2>> "$RES/llama_bench.err" | tee -a "$RES/llama_bench.md" || rc=1
    done
    # each round's ratio to the same round's f16 (BENCH_TYPES with f16 in it)
    python3 scripts/gpu/bench_ratios.py "$RES/llama_bench.md" > "$RES/llama_bench_ratios.md" 2> /dev/null &&
        cat "$RES/llama_bench_ratios.md"
    return "$rc"
}

# A head-size-H synthetic model (8 layers, 32 heads on 8 KV heads, byte vocabulary): FA decode perf, KLD against the
# GPU f16 run, llama-bench (H = 64: tq3 -> tq3_64; H = 96: tq3 -> tq3_96, decoded by upstream's f16 kernels).
head_stage() {
    local h=$1 m="$W/synth$1.gguf" t rc=0
    PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$m" --n-embd $((32 * h)) --n-head 32 \
        --n-head-kv 8 --n-ctx 40960 --byte-vocab > /dev/null || return 1
    "$bin/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "hsk=$h,hsv=$h,nh=8,nr23=\\[4,4\\],kv=32768" \
        > "$RES/h${h}_fa_perf.log" 2>&1 || rc=1
    grep -E 'FLASH_ATTN_EXT' "$RES/h${h}_fa_perf.log" | sed 's/  */ /g'
    # a slice of the text: the byte vocabulary's tokenizer is slow on the whole file (1.3 MB, one token per byte)
    head -c 16384 .gpu/wiki.test.raw > "$W/h${h}_text.txt"
    local base="$W/h${h}_f16.kld" ppl=("$bin/llama-perplexity" -m "$m" -f "$W/h${h}_text.txt" -c 1024 -b 512 --chunks 6 -fa on -lv 4)
    "${ppl[@]}" -ngl 99 --kl-divergence-base "$base" > "$RES/h${h}_ppl_f16_base.log" 2>&1 || rc=1
    for run in q4_0:99 tq4:99 tq3:99 tq3:0; do
        t=${run%:*}
        "${ppl[@]}" -ctk "$t" -ctv "$t" -ngl "${run#*:}" -t "$(nproc)" --kl-divergence-base "$base" --kl-divergence \
            > "$RES/h${h}_kld_${t}_ngl${run#*:}.log" 2>&1 || rc=1
        printf 'h%s KLD %-5s ngl %-2s %s | %s\n' "$h" "$t" "${run#*:}" \
            "$(grep -m1 'Mean    KLD' "$RES/h${h}_kld_${t}_ngl${run#*:}.log")" \
            "$(grep -m1 -o 'uses [0-9]*-value blocks[^)]*)' "$RES/h${h}_kld_${t}_ngl${run#*:}.log")"
    done
    : > "$RES/h${h}_llama_bench.md"
    for t in ${H_TYPES:-f16 q8_0 q4_0 tq4 tq3}; do
        "$bin/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512 -n 128 -d "${H_DEPTHS:-0,4096,32768}" -r "${BENCH_REPS:-5}" \
            -ctk "$t" -ctv "$t" -o md 2>> "$RES/h${h}_llama_bench.err" | tee -a "$RES/h${h}_llama_bench.md" || rc=1
    done
    return "$rc"
}

stage_head64() { head_stage 64; }
stage_head96() { head_stage 96; }

stage_evict() {
    local m="$W/synth_ev.gguf" ngl pol log rc=0 t0
    PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$m" --n-layer 8 --n-embd 1024 --n-head 8 \
        --n-head-kv 4 --n-ctx 8192 --byte-vocab > /dev/null || return 1
    head -c 20000 .gpu/wiki.test.raw > "$W/ev_text.txt"
    for ngl in 99 0; do
        for pol in none 2 3; do
            log="$RES/evict_ngl${ngl}_$pol.log"
            local ev=()
            [ "$pol" != none ] && ev=(--triatt-budget 1024 --triatt-warmup 256 --triatt-divide 64 --triatt-hybrid "$pol")
            t0=$(date +%s.%N)
            "$bin/llama-perplexity" -m "$m" -f "$W/ev_text.txt" -c 2048 -b 512 -ub 128 --chunks 3 -fa on -lv 4 \
                -ngl "$ngl" -t "$(nproc)" "${ev[@]}" > "$log" 2>&1 || rc=1
            printf 'evict ngl %-2s policy %-4s wall %6.2f s  %s  rounds %s  evicted %s\n' "$ngl" "$pol" \
                "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')" \
                "$(grep -o 'Final estimate: PPL = [0-9.]*' "$log")" "$(grep -c 'triatt: evict:' "$log")" \
                "$(grep -o 'evicted [0-9]*/' "$log" | tr -dc '0-9\n' | awk '{ s += $1 } END { print s + 0 }')"
        done
    done
    stage_overhead || rc=1
    return "$rc"
}

# Eviction overhead, no eviction and V3 interleaved (EV_REPS rounds, llama_perf's total time), on the GPU and the CPU:
#   stress:   -c 2048 -ub 128 --chunks 16, budget 1024, warmup 256, divide 64: a round after every 128-token ubatch
#   defaults: -c 8192 --chunks 4 (ubatches of 512), budget 4096, the default warmup and divide
# Prints each run, then per protocol and backend the mean times and their ratio (V3 / none). EV_TAG prefixes the logs.
stage_overhead() {
    local m="$W/synth_ev.gguf" ngl rep pol proto log rc=0
    [ -f "$m" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$m" --n-layer 8 --n-embd 1024 \
        --n-head 8 --n-head-kv 4 --n-ctx 8192 --byte-vocab > /dev/null || return 1
    head -c 40000 .gpu/wiki.test.raw > "$W/ev40.txt"
    local sum="$RES/${EV_TAG:-}overhead.txt"
    for proto in ${EV_PROTOS:-stress defaults}; do
        local args=(-c 2048 -b 512 -ub 128 --chunks 16) ev=(--triatt-budget 1024 --triatt-warmup 256 --triatt-divide 64)
        if [ "$proto" = defaults ]; then
            args=(-c 8192 -b 512 --chunks 4) ev=(--triatt-budget 4096)
        fi
        for ngl in ${EV_NGL:-99 0}; do
            for rep in $(seq "${EV_REPS:-3}"); do
                for pol in none 2; do
                    log="$RES/${EV_TAG:-}ov_${proto}_ngl${ngl}_${pol}_$rep.log"
                    local e=()
                    [ "$pol" != none ] && e=("${ev[@]}" --triatt-hybrid "$pol")
                    # shellcheck disable=SC2086  # EV_KV: "-ctk T -ctv T" or nothing (f16)
                    "$bin/llama-perplexity" -m "$m" -f "$W/ev40.txt" "${args[@]}" -fa on -lv 4 -ngl "$ngl" \
                        -t "$(nproc)" ${EV_KV:-} "${e[@]}" > "$log" 2>&1 || rc=1
                    printf 'overhead %-8s ngl %-2s rep %s policy %-4s %s %s\n' "$proto" "$ngl" "$rep" "$pol" \
                        "$(grep -o 'total time = *[0-9.]* ms' "$log")" "$(grep -o 'summary: .*' "$log")" | tee -a "$sum"
                done
            done
        done
    done
    # means and ratios: "overhead PROTO ngl N rep R policy P total time = T ms ..."
    awk '$1 == "overhead" { k = $2 " ngl " $4; t[k, $8] += $12; n[k, $8]++; keys[k] = 1 }
         END { for (k in keys) printf "ratio %-20s none %8.1f ms  V3 %8.1f ms  V3/none %.3f\n", k,
                   t[k, "none"] / n[k, "none"], t[k, "2"] / n[k, "2"], (t[k, "2"] / n[k, "2"]) / (t[k, "none"] / n[k, "none"]) }' \
        "$sum" | sort | tee -a "$sum"
    return "$rc"
}

# the 8B shape with a byte vocabulary (llama-perplexity / llama-completion tokenize text), and the text they read
llama8b_bytes_model() {
    [ -f "$W/llama8b_bytes.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth \
        "$W/llama8b_bytes.gguf" --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 --n-ff 14336 --n-ctx 40960 \
        --byte-vocab > /dev/null || return 1
    head -c 40000 .gpu/wiki.test.raw > "$W/ev40.txt"
}

stage_evict8b() {
    local m="$W/llama8b_bytes.gguf" kv rep proto cfg log rc=0
    llama8b_bytes_model || return 1
    head -c 4096 .gpu/wiki.test.raw > "$W/ev4k.txt"
    local sum="$RES/evict8b.txt"
    [ "${EV8_APPEND:-0}" = 1 ] || : > "$sum"
    for rep in $(seq "${EV8_REPS:-2}"); do
        for kv in ${EV8_KV:-f16 tq3}; do
            for proto in ${EV8_PROTOS:-ub512 ub128 decode}; do
                for cfg in none late once; do
                    [ "$cfg" = once ] && [ "$proto" != ub512 ] && continue # rounds at once differ only after long ubatches
                    log="$RES/ev8_${kv}_${proto}_${cfg}_$rep.log"
                    local ev=() env=()
                    [ "$cfg" != none ] && ev=(--triatt-budget 4096)
                    [ "$cfg" = once ] && env=(LLAMA_TQ_TRIATT_LATE_DISABLE=1)
                    if [ "$proto" = decode ]; then
                        [ "$cfg" != none ] && ev=(--triatt-budget 2048)
                        env "${env[@]}" "$bin/llama-completion" -m "$m" -f "$W/ev4k.txt" -c 8192 -n 512 -no-cnv \
                            --no-display-prompt --temp 0 --ignore-eos -ngl 99 -fa on -lv 4 -ctk "$kv" -ctv "$kv" \
                            "${ev[@]}" > "$log" 2>&1 < /dev/null || rc=1
                    else
                        env "${env[@]}" "$bin/llama-perplexity" -m "$m" -f "$W/ev40.txt" -c 8192 -b 512 \
                            -ub "${proto#ub}" --chunks 4 -ngl 99 -fa on -lv 4 -ctk "$kv" -ctv "$kv" "${ev[@]}" \
                            > "$log" 2>&1 || rc=1
                    fi
                    printf 'evict8b kv %s proto %s cfg %s rep %s | %s | %s | %s | rounds %s late %s\n' "$kv" "$proto" "$cfg" \
                        "$rep" "$(grep -o 'total time = *[0-9.]* ms' "$log" | tail -1)" \
                        "$(grep ' eval time' "$log" | grep -v 'prompt eval' | grep -o 'eval time = *[0-9.]* ms / *[0-9]* runs' | tail -1)" \
                        "$(grep -o 'Final estimate: PPL = [0-9.]*' "$log")" "$(grep -c 'triatt: evict:' "$log")" \
                        "$(grep -c 'late=1' "$log")" | tee -a "$sum"
                done
            done
        done
    done
    python3 scripts/gpu/evict8b.py "$sum" | tee "$RES/evict8b.md"
    return "$rc"
}

# every round's kept positions in a llama-tool log at -v (their hash), one line a round
kept_positions() { grep -a -o 'triatt: round [0-9]* ms: .*kept=[0-9a-f]*' "$1" | sed 's/ ms:.*kept=/ kept=/'; }

stage_gathercheck() {
    local m="$W/llama8b_bytes.gguf" kv mode rc=0
    llama8b_bytes_model || return 1
    for kv in f16 tq3; do
        for mode in device ranges; do
            local env=()
            [ "$mode" = ranges ] && env=(LLAMA_TQ_TRIATT_DEVICE_GATHER_DISABLE=1)
            env "${env[@]}" "$bin/llama-perplexity" -m "$m" -f "$W/ev40.txt" -c 8192 -b 512 -ub 512 --chunks 2 -ngl 99 \
                -fa on -v -ctk "$kv" -ctv "$kv" --triatt-budget 4096 > "$W/gc_${kv}_$mode.log" 2>&1 || rc=1
            kept_positions "$W/gc_${kv}_$mode.log" > "$RES/gathercheck_${kv}_$mode.txt"
        done
        if [ -s "$RES/gathercheck_${kv}_device.txt" ] && cmp -s "$RES/gathercheck_${kv}_device.txt" "$RES/gathercheck_${kv}_ranges.txt"; then
            echo "gathercheck $kv: $(wc -l < "$RES/gathercheck_${kv}_device.txt") rounds, kept positions identical"
        else
            echo "gathercheck $kv: DIFFERENT or empty"; rc=1
        fi
    done
    return "$rc"
}

stage_calibcheck() {
    local m="$W/llama8b_bytes.gguf" kv rep cfg log rc=0
    llama8b_bytes_model || return 1
    : > "$RES/calibcheck.txt"
    for rep in $(seq "${CC_REPS:-2}"); do
        for kv in ${CC_KV:-f16}; do
            for cfg in none async sync; do
                local env=() ev=(--triatt-budget 4096)
                [ "$cfg" = none ] && ev=()
                [ "$cfg" = sync ] && env=(LLAMA_TQ_TRIATT_ASYNC_CAPTURE_DISABLE=1)
                log="$RES/cc_${kv}_${cfg}_$rep.log"
                env "${env[@]}" "$bin/llama-perplexity" -m "$m" -f "$W/ev40.txt" -c 8192 -b 512 -ub 512 --chunks 4 \
                    -ngl 99 -fa on -v -ctk "$kv" -ctv "$kv" "${ev[@]}" > "$log" 2>&1 || rc=1
                kept_positions "$log" > "$W/cc_${kv}_${cfg}_$rep.kept"
                printf 'calibcheck kv %s cfg %s rep %s | %s | %s | %s | rounds %s\n' "$kv" "$cfg" "$rep" \
                    "$(grep -a -o 'total time = *[0-9.]* ms' "$log" | tail -1)" "$(grep -a -o '[0-9.]* seconds per pass' "$log")" \
                    "$(grep -a -o 'Final estimate: PPL = [0-9.]*' "$log")" "$(wc -l < "$W/cc_${kv}_${cfg}_$rep.kept")" |
                    tee -a "$RES/calibcheck.txt"
            done
            local ppl_a ppl_s
            ppl_a=$(grep -a -o 'Final estimate: PPL = [0-9.]*' "$RES/cc_${kv}_async_$rep.log")
            ppl_s=$(grep -a -o 'Final estimate: PPL = [0-9.]*' "$RES/cc_${kv}_sync_$rep.log")
            if [ -s "$W/cc_${kv}_async_$rep.kept" ] && cmp -s "$W/cc_${kv}_async_$rep.kept" "$W/cc_${kv}_sync_$rep.kept" &&
                [ -n "$ppl_a" ] && [ "$ppl_a" = "$ppl_s" ]; then
                echo "calibcheck $kv rep $rep: kept positions and PPL identical (async vs sync)" | tee -a "$RES/calibcheck.txt"
            else
                echo "calibcheck $kv rep $rep: kept positions or PPL DIFFERENT or empty" | tee -a "$RES/calibcheck.txt"; rc=1
            fi
        done
    done
    return "$rc"
}

stage_bandwidth() {
    python3 scripts/gpu/fa_bandwidth.py "$RES" > "$RES/fa_bandwidth.md" && cat "$RES/fa_bandwidth.md"
}

stage_summary() {
    python3 scripts/gpu/summary.py "$RES" > "$RES/summary.json"
}

stage_profile() {
    [ -f "$W/synth.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null || return 1
    local kv d rc=0
    for d in ${PROFILE_DEPTHS:-0}; do
        for kv in ${PROFILE_KV:-f16/f16 q8_0/q8_0 tq3/tq3 tq4/tq4 tq3/f16 f16/tq3}; do
            # the last 8 decode tokens of tg16 (graph nodes profiled one by one), kernel times summed by name
            # shellcheck disable=SC2086  # NCU_EXTRA: more ncu flags, e.g. "--cache-control none --clock-control none"
            ncu --metrics gpu__time_duration.sum --csv --graph-profiling node --kernel-name regex:. ${NCU_EXTRA:-} \
                "$bin/llama-bench" -m "$W/synth.gguf" -ngl 99 -fa 1 -p 0 -n 16 -d "$d" -r 1 \
                -ctk "${kv%/*}" -ctv "${kv#*/}" > "$W/prof.csv" 2> /dev/null || rc=1
            python3 scripts/gpu/kernel_times.py "$W/prof.csv" "$kv" "$d" | tee -a "$RES/decode_kernels.txt"
        done
    done
    return "$rc"
}

# Decode kernels inside real graphs: llama-perplexity on a head-128 synthetic model (byte vocabulary) with ubatches
# of 1 and 8 tokens (the TQ decode kernels) and 128 (prefill), on the GPU and on the CPU: PPL within a few tenths.
stage_graphppl() {
    local m="$W/synth_ev.gguf" ub kv run log rc=0
    [ -f "$m" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$m" --n-layer 8 --n-embd 1024 \
        --n-head 8 --n-head-kv 4 --n-ctx 8192 --byte-vocab > /dev/null || return 1
    head -c 20000 .gpu/wiki.test.raw > "$W/ev_text.txt"
    for kv in ${GP_KV:-tq3/tq3 tq4/tq3}; do
        for ub in ${GP_UB:-1 8 128}; do
            for run in gpu cpu; do
                log="$RES/graphppl_${kv/\//_}_ub${ub}_$run.log"
                "$bin/llama-perplexity" -m "$m" -f "$W/ev_text.txt" -c 512 -b 512 -ub "$ub" --chunks 3 -fa on \
                    -ctk "${kv%/*}" -ctv "${kv#*/}" -ngl "$([ "$run" = cpu ] && echo 0 || echo 99)" -t "$(nproc)" \
                    > "$log" 2>&1 || rc=1
                printf 'graphppl %-8s ub %-3s %-5s %s\n' "$kv" "$ub" "$run" "$(grep -o 'Final estimate: PPL = [0-9.]*' "$log")"
            done
        done
    done
    return "$rc"
}

stage_ncu() {
    ncu --kernel-name regex:'tq_fa_(decode|mma)_kernel' --launch-count 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats "$bin/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT \
        -p 'nh=8,nr23=\[4,4\],kv=32768,nb=1,.*type_K=tq3,type_V=tq3' > "$RES/ncu_tq3_decode.txt" 2>&1
    local rc=$?
    grep -E 'Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers|Achieved Occupancy|Theoretical Occupancy|Stall' \
        "$RES/ncu_tq3_decode.txt" | head -20
    return "$rc"
}

stage_ncu_kernel() { # ncu on the harness's tensor-core kernel, no llama.cpp build needed: warp stall reasons, occupancy
    # and memory throughput of the 4 x 8 and 1 x 4 x 32K tq3/tq3 cases (fa_decode_bench perf 0 / 1), built as
    # kernel_ab's variant (KERNEL_DEFINES); ncu_kernel_N.txt
    local defs=() n rc=0
    read -ra defs <<< "${KERNEL_DEFINES:-}"
    codec_obj || return 1
    fa_bench "$PWD" fa_decode_bench_ncu -lineinfo "${defs[@]}" || return 1
    for n in 0 1; do
        ncu --kernel-name regex:tq_fa_mma_kernel --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --print-details all \
            "$W/fa_decode_bench_ncu" perf "$n" > "$RES/ncu_kernel_$n.txt" 2>&1 || rc=1
        echo "-- case $n ${defs[*]}"
        grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Eligible Warps|No Eligible|Stall' \
            "$RES/ncu_kernel_$n.txt" | head -40
    done
    return "$rc"
}

# A head-128 synthetic model (8 layers, 32 heads on 8 KV heads, byte vocabulary: no model pieces to carry) and a
# 16 KB slice of the text for it (its tokenizer is slow on the whole file: one token per byte).
synth128() {
    [ -f "$W/synth128.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth128.gguf" \
        --n-embd 4096 --n-head 32 --n-head-kv 8 --n-ctx 40960 --byte-vocab > /dev/null || return 1
    head -c 16384 .gpu/wiki.test.raw > "$W/text16k.txt"
}

# The per-sequence key means on the GPU (one fused launch a layer) against the CPU's: KLD of tq3/tq3 against the GPU
# f16 run, one sequence (-c 1024 -b 512) and four at once (-c 256 -b 1024: n_seq = 4, the means of four sequences
# from one ubatch, each token centered with its own).
stage_keymean() {
    synth128 || return 1
    local c b base ngl log rc=0
    for cb in 1024:512 256:1024; do
        c=${cb%:*} b=${cb#*:} base="$W/km_f16_$c.kld"
        local ppl=("$bin/llama-perplexity" -m "$W/synth128.gguf" -f "$W/text16k.txt" -c "$c" -b "$b" --chunks 8 -fa on)
        "${ppl[@]}" -ngl 99 --kl-divergence-base "$base" > "$RES/km_f16_$c.log" 2>&1 || rc=1
        for ngl in 99 0; do
            log="$RES/km_tq3_c${c}_ngl$ngl.log"
            "${ppl[@]}" -ctk tq3 -ctv tq3 -ngl "$ngl" -t "$(nproc)" --kl-divergence-base "$base" --kl-divergence \
                > "$log" 2>&1 || rc=1
            printf 'keymean -c %-4s -b %-4s ngl %-2s %s (%s)\n' "$c" "$b" "$ngl" "$(grep -m1 'Mean    KLD' "$log")" \
                "$(grep -m1 -o 'n_seq=[0-9]*' "$log")"
        done
    done
    return "$rc"
}

# -sm none (one GPU) / layer / tensor over two GPUs, TQ caches: the same PPL, and the 8B shape's speed with each split
stage_multigpu() {
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "multigpu: needs two GPUs"; return 1; }
    synth128 || return 1
    local kv sm log rc=0
    for kv in f16 tq3; do
        for sm in none layer tensor; do
            log="$RES/mg_ppl_${kv}_$sm.log"
            "$bin/llama-perplexity" -m "$W/synth128.gguf" -f "$W/text16k.txt" -c 1024 -b 512 --chunks 8 -fa on \
                -ctk "$kv" -ctv "$kv" -ngl 99 -sm "$sm" > "$log" 2>&1 || rc=1
            printf 'ppl %-4s -sm %-5s %s\n' "$kv" "$sm" "$(grep 'Final estimate' "$log")"
        done
    done
    [ -f "$W/synth8b.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth8b.gguf" \
        --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 --n-ff 14336 --n-vocab 32000 --n-ctx 40960 > /dev/null ||
        return 1
    : > "$RES/multigpu_bench.md"
    for sm in none layer tensor; do
        for kv in f16 tq3; do
            "$bin/llama-bench" -m "$W/synth8b.gguf" -ngl 99 -fa 1 -p 512 -n 128 -d 0,32768 -r "${BENCH_REPS:-3}" \
                -sm "$sm" -ctk "$kv" -ctv "$kv" -o md 2>> "$RES/multigpu_bench.err" | tee -a "$RES/multigpu_bench.md" ||
                rc=1
        done
    done
    return "$rc"
}

# A CUDA ggml-rpc-server on loopback; the client sees no local GPU, so -ngl 99 puts every layer and its KV cache on
# the remote device. PPL against the same cache on the local GPU.
stage_rpc() {
    synth128 || return 1
    local port=50052 kv log rc=0 pid
    "$bin/ggml-rpc-server" -H 127.0.0.1 -p "$port" -d CUDA0 > "$RES/rpc_server.log" 2>&1 &
    pid=$!
    sleep 3
    for kv in f16 tq3; do
        for where in local remote; do
            log="$RES/rpc_ppl_${kv}_$where.log"
            local env=() rpc=()
            [ "$where" = remote ] && env=(CUDA_VISIBLE_DEVICES=) && rpc=(--rpc "127.0.0.1:$port")
            env "${env[@]}" "$bin/llama-perplexity" -m "$W/synth128.gguf" -f "$W/text16k.txt" -c 1024 -b 512 \
                --chunks 8 -fa on -ctk "$kv" -ctv "$kv" -ngl 99 "${rpc[@]}" > "$log" 2>&1 || rc=1
            printf 'ppl %-4s %-6s %s | %s\n' "$kv" "$where" "$(grep 'Final estimate' "$log")" \
                "$(grep -m1 -o '[A-Z0-9]*\[\?[0-9.:]*\]\? KV buffer size = *[0-9.]* MiB' "$log")"
        done
    done
    kill "$pid"
    return "$rc"
}

kbias_models() {
    local m name b pl
    for m in q0:0:all q10all:10:all q10slow:10:slow q10fast:10:fast; do
        IFS=: read -r name b pl <<< "$m"
        [ -f "$W/$name.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/$name.gguf" \
            --arch qwen2 --n-layer 4 --n-embd 1024 --n-head 8 --n-head-kv 2 --n-ff 2816 --n-ctx 32768 --byte-vocab \
            --k-bias "$b" --k-bias-pairs "$pl" > /dev/null || return 1
    done
    head -c 100000 .gpu/wiki.test.raw > "$W/text100k.txt" # 4 chunks of 16384 byte tokens
}

stage_kbias() {
    kbias_models || return 1
    local out="$RES/kbias.tsv" name c base t k v env log rc=0
    printf 'model\tctx\tK\tV\tbias\tngl\tub\tkld\tsame_top\n' > "$out"
    run_kld() { # name ctx k v bias(removed|kept) ngl ub
        log="$RES/kb_$1_c$2_$3_$4_$5_ngl$6_ub$7.log"
        env=()
        [ "$5" = kept ] && env=(LLAMA_TQ_KEY_BIAS_DISABLE=1)
        env "${env[@]}" "$bin/llama-perplexity" -m "$W/$1.gguf" -f "$W/text100k.txt" -c "$2" -b 512 -ub "$7" \
            --chunks 4 -fa on -ngl "$6" -t "$(nproc)" -ctk "$3" -ctv "$4" --kl-divergence-base "$W/kb_$1_$2.kld" \
            --kl-divergence > "$log" 2>&1 || rc=1
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" "$(sed -n 's/^Mean *KLD: *\([-0-9.]*\).*/\1/p' "$log")" \
            "$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$log")" | tee -a "$out"
    }
    for c in 1024 16384; do
        for name in q0 q10all q10slow q10fast; do
            "$bin/llama-perplexity" -m "$W/$name.gguf" -f "$W/text100k.txt" -c "$c" -b 512 --chunks 4 -fa on -ngl 99 \
                --kl-divergence-base "$W/kb_${name}_$c.kld" > "$RES/kb_${name}_c${c}_base.log" 2>&1 || rc=1
            for t in tq3:tq3 tq4:tq4 q4_0:q4_0 q8_0:q8_0 tq3:f16 f16:tq3 tq4:tq3; do
                k=${t%:*} v=${t#*:}
                run_kld "$name" "$c" "$k" "$v" removed 99 512
                if [ "$name" != q0 ] && [[ "$k" == tq* ]]; then
                    run_kld "$name" "$c" "$k" "$v" kept 99 512
                fi
            done
        done
    done
    for ub in 512 8; do # GPU against CPU, each way of adding the bias back
        for ngl in 99 0; do
            run_kld q10all 1024 tq3 tq3 removed "$ngl" "$ub"
        done
    done
    # four sequences at once (-c 256 -b 1024), one unified stream or a stream each
    local streams p4=("$bin/llama-perplexity" -m "$W/q10all.gguf" -f "$W/text100k.txt" -c 256 -b 1024 --chunks 8 -fa on)
    "${p4[@]}" -ngl 99 --kl-divergence-base "$W/kb_q10all_256x4.kld" > "$RES/kb_q10all_256x4_base.log" 2>&1 || rc=1
    for ub in 512 8; do
        for streams in --kv-unified --no-kv-unified; do
            for ngl in 99 0; do
                log="$RES/kb_q10all_256x4_ub${ub}_${streams#--}_ngl$ngl.log"
                "${p4[@]}" -ub "$ub" "$streams" -ngl "$ngl" -t "$(nproc)" -ctk tq3 -ctv tq3 \
                    --kl-divergence-base "$W/kb_q10all_256x4.kld" --kl-divergence > "$log" 2>&1 || rc=1
                printf 'q10all -c 256 -b 1024 -ub %-3s %-15s ngl %-2s %s\n' "$ub" "$streams" "$ngl" \
                    "$(grep -m1 'Mean    KLD' "$log")"
            done
        done
    done
    return "$rc"
}

stage_kbdecode() {
    kbias_models || return 1
    local out="$RES/kbdecode.tsv" ub args tag log rc=0 env
    local kld='s/.*Mean *KLD: *\([-0-9.e]*\).*/\1/p' top='s/.*Same top p: *\([0-9.]*\).*/\1/p'
    "$bin/test-backend-ops" -b CUDA0 -o TQ_KEY_BIAS_MASK > "$RES/kbdecode_ops.log" 2>&1 || rc=1
    grep -E 'tests passed' "$RES/kbdecode_ops.log"
    kb_variant_env
    printf 'case\tub\trun\tkld_vs_f16\tsame_top\n' > "$out"
    row() { # case ub run log
        printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(sed -n "$kld" "$4")" "$(sed -n "$top" "$4")" | tee -a "$out"
    }
    for ub in 1 8; do
        for args in "-c 1024 -b 1024" "-c 256 -b 1024 --kv-unified"; do
            # shellcheck disable=SC2206  # args: a list
            local p=("$bin/llama-perplexity" -m "$W/q10all.gguf" -f "$W/text100k.txt" $args -ub "$ub" --chunks 4 -fa on
                     -t "$(nproc)")
            tag="${ub}_${args// /}" log="$RES/kbd_$tag"
            "${p[@]}" -ngl 99 --kl-divergence-base "$W/kbd_$tag.kld" > "$log.f16.log" 2>&1 || rc=1
            local q=("${p[@]}" -ctk tq3 -ctv tq3 --kl-divergence-base "$W/kbd_$tag.kld" --kl-divergence)
            "${q[@]}" -ngl 99 > "$log.gpu.log" 2>&1 || rc=1
            row "$args" "$ub" gpu "$log.gpu.log"
            if [ ${#env[@]} -gt 0 ]; then
                env "${env[@]}" "${q[@]}" -ngl 99 > "$log.variant.log" 2>&1 || rc=1
                row "$args" "$ub" "gpu ${env[*]}" "$log.variant.log"
            fi
            if [ "$args" = "-c 1024 -b 1024" ]; then
                "${q[@]}" -ngl 0 > "$log.cpu.log" 2>&1 || rc=1
                row "$args" "$ub" cpu "$log.cpu.log"
            fi
        done
    done
    return "$rc"
}

# KB_VARIANT_ENV as an array in the caller's `env` (empty when unset): the stages' extra run of the biased model
kb_variant_env() {
    env=()
    [ -z "${KB_VARIANT_ENV:-}" ] || read -ra env <<< "$KB_VARIANT_ENV"
}

kbias8b_models() { # the 8B shape as qwen2, without and with a K bias (the same weights)
    local b
    for b in 0 10; do
        [ -f "$W/q8b_$b.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/q8b_$b.gguf" \
            --arch qwen2 --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 --n-ff 14336 --n-vocab 32000 \
            --n-ctx 40960 --k-bias "$b" > /dev/null || return 1
    done
}

# Where a decode step's time goes with and without the K bias: CUPTI kernel timeline of llama-bench tq3 tg at
# depths 0 and 32768 (lab/cuda/kernel_trace.c, LD_PRELOAD), summarized per kernel by lab/cuda/kernel_trace_stats.py;
# KB_VARIANT_ENV adds the biased model under that environment.
stage_kbtrace() {
    kbias8b_models || return 1
    local inc lib so="$W/kernel_trace.so" name d env rc=0
    inc=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
    lib=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
    gcc -O2 -shared -fPIC -I"$inc" -o "$so" lab/cuda/kernel_trace.c -L"$lib" -lcupti || return 1
    for d in 0 32768; do
        for name in q8b_0 q8b_10 q8b_10:variant; do
            env=()
            if [ "$name" = q8b_10:variant ]; then
                kb_variant_env
                [ ${#env[@]} -gt 0 ] || continue
            fi
            local t="$RES/kbtrace_${name/:/_}_d$d"
            env "${env[@]}" TRACE_OUT="$t.txt" LD_PRELOAD="$so" LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" \
                "$bin/llama-bench" -m "$W/${name%:variant}.gguf" -ngl 99 -fa 1 -p 0 -n 64 -d "$d" -r 2 -ctk tq3 \
                -ctv tq3 -o md > "$t.bench.md" 2> "$t.err" || rc=1
            python3 lab/cuda/kernel_trace_stats.py "$t.txt" --last 100 > "$t.md" 2>&1 || rc=1
            rm -f "$t.txt"
            echo "== $name d$d ${env[*]}"
            grep tg64 "$t.bench.md"
            head -30 "$t.md"
        done
    done
    return "$rc"
}

stage_kbias8b() {
    local r name kv env rc=0
    kbias8b_models || return 1
    : > "$RES/kbias8b.md"
    for r in $(seq "${KB_REPS:-3}"); do
        for kv in ${KB_TYPES:-f16 tq3 tq4}; do
            for name in q8b_0 q8b_10 q8b_10:variant; do
                env=()
                if [ "$name" = q8b_10:variant ]; then # KB_VARIANT_ENV's run beside the others: TQ only
                    kb_variant_env
                    [[ ${#env[@]} -gt 0 && "$kv" == tq* ]] || continue
                fi
                echo "round $r $name $kv ${env[*]}" >> "$RES/kbias8b.md"
                env "${env[@]}" "$bin/llama-bench" -m "$W/${name%:variant}.gguf" -ngl 99 -fa 1 -p "${KB_P:-512}" -n 128 \
                    -d "${KB_DEPTHS:-0,32768}" -r 1 -ctk "$kv" -ctv "$kv" -o md 2>> "$RES/kbias8b.err" |
                    tee -a "$RES/kbias8b.md" || rc=1
            done
        done
    done
    return "$rc"
}

llama8b_model() {
    [ -f "$W/llama8b.gguf" ] || PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/llama8b.gguf" \
        --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 --n-ff 14336 --n-vocab 32000 --n-ctx 40960 > /dev/null
}

llama8b_rounds() { # FILE REPS DEPTHS P: interleaved rounds of every L8_TYPES pair, "round N K/V" before each run
    local f=$1 r kv rc=0
    [ "${L8_APPEND:-0}" = 1 ] || : > "$f"
    for r in $(seq "$2"); do
        for kv in ${L8_TYPES:-f16 q8_0 q4_0 tq4 tq3 tq4/tq3}; do
            echo "round $r ${kv%/*}/${kv#*/}" >> "$f"
            "$bin/llama-bench" -m "$W/llama8b.gguf" -ngl 99 -fa 1 -p "$4" -n 128 -d "$3" -r 1 -ctk "${kv%/*}" \
                -ctv "${kv#*/}" -o md 2>> "${f%.md}.err" | tee -a "$f" || rc=1
        done
    done
    python3 scripts/gpu/llama8b.py "$RES" > "$RES/llama8b_table.md" && cat "$RES/llama8b_table.md"
    return "$rc"
}

stage_llama8b() {
    llama8b_model || return 1
    llama8b_rounds "$RES/llama8b.md" "${L8_REPS:-2}" "${L8_DEPTHS:-0,32768}" 512
}

stage_llama8b_long() {
    llama8b_model || return 1
    llama8b_rounds "$RES/llama8b_long.md" 1 131072 "${L8_LONG_P:-512}"
}

stage_llama8b_perf() {
    [ -f "$RES/convert_bench.txt" ] || stage_convert > /dev/null || return 1
    # the six pairs only (patch 0006's perf list also has mixed pairs); ~20 s a case, so L8_PERF_KV can split the
    # KV lengths over calls (L8_APPEND=1 keeps the log)
    local pairs='f16,type_V=f16|q8_0,type_V=q8_0|q4_0,type_V=q4_0|tq4,type_V=tq4|tq3,type_V=tq3|tq4,type_V=tq3'
    [ "${L8_APPEND:-0}" = 1 ] || : > "$RES/fa_perf_llama8b.log"
    "$bin/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT \
        -p "hsk=(128|256),hsv=(128|256),nh=(4,nr23=\\[4,1\\]|8,nr23=\\[4,4\\]),kv=(${L8_PERF_KV:-32768|131072}),nb=1,.*type_K=($pairs)," \
        >> "$RES/fa_perf_llama8b.log" 2>&1
    local rc=$?
    python3 scripts/gpu/llama8b.py "$RES" > "$RES/llama8b_table.md" && cat "$RES/llama8b_table.md"
    return "$rc"
}

for s in "${stages[@]}"; do
    note "$s"
    start=$(date +%s)
    if ! "stage_$s"; then
        note "$s FAILED"
        fail=1
    fi
    note "$s took $(( $(date +%s) - start )) s"
done
exit $fail
