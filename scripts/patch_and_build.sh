#!/usr/bin/env bash
# Patch your own llama.cpp tree with llama-tq's series and build its tools with plain cmake.
#   usage: scripts/patch_and_build.sh LLAMA_CPP_DIR [BUILD_DIR] [extra cmake args...]
# Needs the `llama-tq` command (pip install .). Writes patch_and_build_results.txt in the current directory
# and exits non-zero if the series does not apply or the build fails.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 LLAMA_CPP_DIR [BUILD_DIR] [extra cmake args...]" >&2
    exit 2
fi
src=$1
build=${2:-$src/build-tq}
shift $(( $# >= 2 ? 2 : 1 ))
results=patch_and_build_results.txt

llama-tq patch "$src" --check | tee "$results"
llama-tq patch "$src" | tee -a "$results"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$(date +%s)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_PROJECT_INCLUDE="$here/../cmake/no_amx.cmake" "$@"  # the AMX workaround (cmake/no_amx.cmake)
cmake --build "$build" -j "$(nproc)" --target llama-perplexity llama-completion llama-bench
echo "build wall time: $(( $(date +%s) - start )) s" | tee -a "$results"
"$build/bin/llama-completion" --version 2>&1 | tee -a "$results"
