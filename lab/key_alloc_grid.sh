#!/usr/bin/env bash
# Issue 47 gate 2: the 40-cell NIAH grid with keys coded by lab/key_allocation.py's scheme in an f16 K cache (the
# keys-measuring hook, LLAMA_TQ_KEYS_EMULATE=alloc:FILE through the harness options @alloc / @alloc3 / @allocp), on
# the prompts the grid's thresholds were set on (bench/results/niah_grid: the harness before f9a36a1, which put the
# needle at a sentence boundary; today's harness puts it at a piece boundary and its prompts are easier for tq3 keys).
#   here:  bash lab/patch.sh apply keys-measuring && PIECE=55M scripts/gpu/pack.sh
#          python lab/key_allocation.py --tokens 4096 --cal 2048 --all-layers --emit --out out/key_alloc  # or global
#          bash lab/key_alloc_grid.sh prepare      # the grid prompts' harness and the haystack into out/key_alloc
#          (or `prepare archived`: the all-layer allocation the KLD run used, from lab/archive/key_allocation-kld,
#          identical to what the line above writes, without its ~12-minute capture; and key_alloc_profile.txt,
#          every layer with one shared width profile, from lab/archive/key_allocation-profile: `--profiles --emit`)
#   GPU:   carry .gpu and out/key_alloc (the model pieces over several calls into $WORK, as run_cuda.sh's niah stage
#          joins them), BUILD_TARGETS="llama-completion llama-tokenize" scripts/gpu/run_cuda.sh build, then
#          bash lab/key_alloc_grid.sh run 16384   # KV=... to choose the configurations; results in $RES
#          KV=f16/tq3@allocp,f16/q8_0@allocp bash lab/key_alloc_grid.sh run 16384   # one profile, every layer
#          NIAH_EXTRA="-b 16384 -ub 16384" KV=f16/tq3@allocp,f16/tq3@allocp+sink bash lab/key_alloc_grid.sh run 16384
#                                                   # the first and newest 128 keys exact (the prompt in one ubatch)
#   then:  python bench/niah_grid.py <results> --ref tq3/q8_0 (bench/results/key_allocation.md)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=out/key_alloc
case ${1:-} in
    prepare)
        if [ "${2:-}" = archived ]; then
            mkdir -p "$dir" # tar writes each file whole or fails (no half-written file behind a redirection)
            tar xJf lab/archive/key_allocation-kld.tar.xz -C "$dir" --strip-components=1 \
                key_allocation-kld/key_alloc.txt key_allocation-kld/key_alloc_tq3layout.txt
            tar xJf lab/archive/key_allocation-profile.tar.xz -C "$dir" --strip-components=1 \
                key_allocation-profile/key_alloc_profile.txt # one width profile for every layer (@allocp)
        fi
        [ -f "$dir/key_alloc.txt" ] || { echo "no $dir/key_alloc.txt: run lab/key_allocation.py --emit first" >&2; exit 1; }
        git show f9a36a1^:python/llama_tq/harness/niah.py > "$dir/niah_grid_prompts.py"
        python3 -c "from llama_tq.harness import demo; open('$dir/haystack_py311.txt','w').write(demo.default_text())"
        sha256sum "$dir/haystack_py311.txt" # the grid's: d9dc35bc...6be371621 (Python 3.11's pydoc topics)
        ;;
    run)
        ctx=${2:?usage: lab/key_alloc_grid.sh run CTX}
        [ -f "$dir/niah_grid_prompts.py" ] || { echo "run 'lab/key_alloc_grid.sh prepare' here first" >&2; exit 1; }
        # the harness that builds the grid's prompts, for this run only (the tree's own is put back at exit)
        h=python/llama_tq/harness/niah.py
        cp "$h" "$dir/niah_today.py"
        trap 'cp "$dir/niah_today.py" "$h"' EXIT
        cp "$dir/niah_grid_prompts.py" "$h"
        export NIAH_PAR=1 NIAH_TEXT=$PWD/$dir/haystack_py311.txt NIAH_CTX=$ctx
        export NIAH_KV=${KV:-tq3/q8_0,f16/q8_0@alloc3,f16/q8_0@alloc,f16/tq3@alloc}
        export NIAH_POS=0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95
        export NIAH_NEEDLES=$'The secret code word is PURPLE ELEPHANT 7742.\nThe password of the old archive is GREEN TIGER 3519.\nThe name of the keeper\'s boat is SILVER HERON 4186.\nThe code for the garden gate is ORANGE CASTLE 2958.'
        scripts/gpu/run_cuda.sh niah
        ;;
    *)
        sed -n '2,18p' "$0" >&2
        exit 2
        ;;
esac
