#!/usr/bin/env bash
# Packs what the GPU machine needs into .gpu/ (git-ignored): the pinned llama.cpp with the patch series applied,
# trimmed to what the CUDA tools need, and the default model in pieces small enough for the device tool's
# 64 MiB per call. run_cuda.sh, on the GPU machine, builds, tests and benchmarks from it.
#   scripts/gpu/pack.sh            (with llama-tq's dependencies and the [model] extra installed)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" # this checkout's patch series
out="$root/.gpu"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out"

"$py" -c 'import sys; from pathlib import Path; from llama_tq.tooling import base; base.extract_base(Path(sys.argv[1]))' "$work/llama.cpp"
"$py" -m llama_tq patch "$work/llama.cpp"

# trim: docs, models, examples, servers and every backend but CPU/CUDA/BLAS stay behind
excl=(./.git ./.github ./docs ./models ./media ./examples ./pocs ./benches ./app ./conversion ./scripts ./ci
      ./requirements ./tools/ui ./tools/server ./skills)
for b in cann hip metal musa sycl vulkan webgpu zdnn opencl hexagon zendnn openvino virtgpu; do
    excl+=("./ggml/src/ggml-$b")
done
targs=()
for e in "${excl[@]}"; do targs+=(--exclude="$e"); done
(cd "$work/llama.cpp" && tar czf "$out/llama-tq-src.tar.gz" "${targs[@]}" .)

model=$("$py" -c 'from llama_tq import models; print(models.default_model())')
split -b "${PIECE:-50M}" -d "$model" "$out/model.part" # PIECE: smaller when the tree is large (64 MiB a call)
cp "${WIKI:-$root/../shared/data/wikitext-2-raw/wiki.test.raw}" "$out/wiki.test.raw"
sha256sum "$model" | cut -d' ' -f1 > "$out/model.sha256"
ls -la "$out"
