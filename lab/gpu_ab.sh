#!/usr/bin/env bash
# A/B on the 8B shape, on the GPU machine: this tree's CUDA build ("after", out/lt) against an earlier commit's
# ("before", out/ltb, from .gpu/before-src.tar.gz: that commit's patched tree, packed as scripts/gpu/pack.sh packs).
# bench/results/cuda/restructure_ab.md came from it (carry .gpu).
# call 1: ab.sh after   -> build after, exact, ops, the 8B model, bench after
# call 2: ab.sh before  -> build before, interleaved bench before/after (tq3, tq4, f16 at d32768)
set -uo pipefail
export WORK=$PWD/out/lt RES=${OUT:-out/ab}
M=$PWD/out/m8b.gguf
synth() {
    [ -f "$M" ] || PYTHONPATH="$WORK/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$M" --n-layer 32 --n-embd 4096 \
        --n-head 32 --n-head-kv 8 --n-ff 14336 --n-vocab 32000 --n-ctx 40960 > /dev/null
}
bench() { # $1 label, $2 bin dir, $3 type
    "$2/llama-bench" -m "$M" -ngl 99 -fa 1 -p 0 -n 128 -d 32768 -r 3 -ctk "$3" -ctv "$3" -o md 2>/dev/null |
        grep tg128 | sed "s/^/$1 /" | tee -a "$RES/ab.md"
}
case $1 in
after)
    BUILD_TARGETS="test-backend-ops llama-bench" bash scripts/gpu/run_cuda.sh build exact ops
    synth && for t in tq3 tq4 f16; do bench after "$WORK/build/bin" $t; done ;;
before)
    mkdir -p out/ltb/src && tar xzf .gpu/before-src.tar.gz -C out/ltb/src &&
        cmake -S out/ltb/src -B out/ltb/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DCMAKE_PROJECT_INCLUDE="$PWD/cmake/no_amx.cmake" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > "$RES/before_build.log" 2>&1 &&
        ninja -C out/ltb/build -j16 llama-bench >> "$RES/before_build.log" 2>&1 || { tail -20 "$RES/before_build.log"; exit 1; }
    synth
    for r in 1 2; do for t in tq3 tq4 f16; do
        bench "before r$r" out/ltb/build/bin $t; bench "after  r$r" "$WORK/build/bin" $t
    done; done ;;
esac
