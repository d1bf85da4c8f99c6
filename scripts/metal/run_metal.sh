#!/usr/bin/env bash
# Builds, tests and benchmarks llama-tq's Metal kernels on an Apple-silicon Mac (they have never run on Apple
# hardware before this script: CI checks them on Linux only, see tests/test_metal_compat.py). Run it from a
# checkout with llama-tq's Python dependencies installed (`pip install ".[test]"` or at least numpy + gguf), then
# commit what it writes under $RES (default out/metal/<date>, git-ignored).
# Stages (default: all), each writing its log into $RES:
#   build  the pinned llama.cpp with the series applied, Metal on: test-backend-ops, llama-bench, llama-perplexity
#   cpu    the CPU emulation of the Metal kernels (tests/metal/test_tq_metal.cpp), as CI runs it
#   ops    test-backend-ops test -b MTL0 for every TQ case of SET_ROWS, GET_ROWS, CPY, FLASH_ATTN_EXT (MUL_MAT with
#          a TQ weight is not a Metal kernel: it must report "not supported", i.e. runs on the CPU)
#   perf   test-backend-ops perf of FLASH_ATTN_EXT decode, TQ next to f16 / q8_0 / q4_0
#   bench  llama-bench on a synthetic 8-layer head-128 model: f16 q8_0 q4_0 tq4 tq3 side by side, -fa 1 -ngl 99
#   usage: scripts/metal/run_metal.sh [stage ...]     env: RES, WORK, BENCH_DEPTHS, BENCH_REPS
# shellcheck disable=SC2317,SC2329  # the stage_* functions are called by name
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
RES=${RES:-out/metal/$(date +%Y-%m-%d)}
W=${WORK:-$root/build/metal-work}
mkdir -p "$RES" "$W"
bin="$W/build/bin"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build cpu ops perf bench)
py=${PYTHON:-python3}
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"

note() { printf '== %s\n' "$*" | tee -a "$RES/run.log"; }

stage_build() {
    rm -rf "$W/src" || return 1
    "$py" -c 'import sys; from pathlib import Path; from llama_tq.tooling import base; base.extract_base(Path(sys.argv[1]))' \
        "$W/src" || return 1
    "$py" -m llama_tq patch "$W/src" || return 1
    local commit
    commit=$(sed -n 's/^LLAMA_CPP_COMMIT=//p' patches/base.env | cut -c1-7)
    cmake -S "$W/src" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$commit" > "$RES/build.log" 2>&1 || return 1
    cmake --build "$W/build" -j "$(sysctl -n hw.ncpu 2>/dev/null || nproc)" \
        --target test-backend-ops llama-bench llama-perplexity >> "$RES/build.log" 2>&1
}

stage_cpu() {
    local cc=${CC:-cc} cxx=${CXX:-c++}
    "$cc" -O2 -ffp-contract=off -c csrc/codec/tq_codec.c -o "$W/tq_codec.o" || return 1
    "$cxx" -std=c++17 -O2 -ffp-contract=off -Wno-attributes -Wno-unknown-attributes -Wno-unknown-pragmas \
        -Itests/metal -Icsrc/llama.cpp/ggml/src/ggml-metal/kernels -I"$W/src/ggml/src/ggml-metal" -Icsrc/codec \
        tests/metal/test_tq_metal.cpp "$W/tq_codec.o" -o "$W/test_tq_metal" -pthread || return 1
    "$W/test_tq_metal" 262144 > "$RES/cpu_emulation.txt"
    local rc=$?
    tail -1 "$RES/cpu_emulation.txt"
    return "$rc"
}

stage_ops() {
    local rc=0 op
    for op in SET_ROWS GET_ROWS CPY FLASH_ATTN_EXT MUL_MAT; do
        "$bin/test-backend-ops" test -b MTL0 -o "$op" -p 'tq[34]' > "$RES/ops_$op.log" 2>&1 || rc=1
        printf '%-15s %s\n' "$op" "$(grep -E 'tests passed|Backend MTL0' "$RES/ops_$op.log" | tail -1)" | tee -a "$RES/run.log"
        grep -c 'FAIL' "$RES/ops_$op.log" | xargs printf '%-15s FAIL lines: %s\n' "$op" | tee -a "$RES/run.log"
    done
    return "$rc"
}

stage_perf() {
    "$bin/test-backend-ops" perf -b MTL0 -o FLASH_ATTN_EXT -p 'hsk=128,hsv=128,nh=4,nr23=\[4,1\],kv=(4096|32768)' \
        > "$RES/fa_perf.log" 2>&1
    local rc=$?
    grep -E 'FLASH_ATTN_EXT' "$RES/fa_perf.log" | sed 's/  */ /g'
    return "$rc"
}

stage_bench() {
    PYTHONPATH="$W/src/gguf-py:$PYTHONPATH" "$py" -m llama_tq.synth "$W/synth.gguf" > /dev/null || return 1
    local t rc=0
    : > "$RES/llama_bench.md"
    for t in f16 q8_0 q4_0 tq4 tq3 f16 tq3; do # f16 and tq3 twice: the spread between runs is part of the result
        "$bin/llama-bench" -m "$W/synth.gguf" -ngl 99 -fa 1 -p 512 -n 128 -d "${BENCH_DEPTHS:-0,4096}" \
            -r "${BENCH_REPS:-5}" -ctk "$t" -ctv "$t" -o md 2>> "$RES/llama_bench.err" | tee -a "$RES/llama_bench.md" || rc=1
    done
    return "$rc"
}

{
    echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(sysctl -n machdep.cpu.brand_string 2>/dev/null)"
    echo "# scripts/metal/run_metal.sh ${stages[*]}"
} >> "$RES/run.log"
fail=0
for s in "${stages[@]}"; do
    note "$s"
    t0=$(date +%s)
    "stage_$s" || { note "$s FAILED"; fail=1; }
    note "$s took $(($(date +%s) - t0)) s"
done
exit "$fail"
