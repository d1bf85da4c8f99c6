#!/usr/bin/env bash
# Applies a measuring patch of lab/patches/ to this checkout's csrc/ (or takes it off again). The shipped libraries
# carry no measuring hooks; a lab study applies the one it needs, builds, measures, and reverts.
#   bash lab/patch.sh apply cuda-stamps     # in-graph timestamps of the CUDA K/V write and FA kernels (-DTQ_STAMPS)
#   bash lab/patch.sh apply cuda-phases     # clock stamps at the quantizer's and the FA kernel's phases
#   bash lab/patch.sh apply keys-measuring  # LLAMA_TQ_KEYS_EMULATE / _TEST_OFFSET / _BASIS_SHRINK in libllama
#   bash lab/patch.sh apply key-bias-fuse   # draft: the K bias's decode mask term fused on CUDA (one kernel)
#   bash lab/patch.sh revert NAME           # exactly undo it
#   bash lab/patch.sh check NAME            # does it apply?
# git apply changes nothing when a patch does not apply.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
action=$1 patch=lab/patches/$2.patch
[ -f "$patch" ] || { echo "no such lab patch: $patch (have: $(cd lab/patches && ls -- *.patch | tr '\n' ' '))" >&2; exit 2; }
case $action in
    apply) git apply --whitespace=nowarn "$patch" ;;
    revert) git apply --reverse --whitespace=nowarn "$patch" ;;
    check) git apply --check "$patch" ;;
    *) echo "unknown action: $action (apply, revert or check)" >&2; exit 2 ;;
esac
echo "lab/patch.sh: $action $2: ok"
