#!/usr/bin/env bash
# v24: shared helpers of the call scripts (sourced): the synthetic model, the CUPTI tracer, a traced llama-bench
# decode run and a tg128 run. Needs W (work dir), bin (llama-bench's dir), LIBS (its libraries' dir).
PYTHONPATH="$W/src/gguf-py:$PWD/python" python3 -m llama_tq.synth "$W/synth.gguf" > /dev/null
CUDA_INC=$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find / -name 'libcupti.so*' 2>/dev/null | grep -v stub | head -1)")
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o "$W/kernel_trace.so" bench/cuda/kernel_trace.c -L"$CUPTI_LIB" -lcupti || exit 1
trace() { # name ctk/ctv [api]: a d0 decode run traced; kernels only, or with TRACE_API=1 the host side too
  TRACE_API=${3:-0} TRACE_OUT=$W/tr_$1.txt LD_PRELOAD=$W/kernel_trace.so LD_LIBRARY_PATH=$LIBS:$CUPTI_LIB \
    "$bin/llama-bench" -m "$W/synth.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 -ctk "${2%/*}" -ctv "${2#*/}" -o csv \
    2>/dev/null > /dev/null
  python3 bench/cuda/kernel_trace_stats.py "$W/tr_$1.txt" --last 300 > "$W/st_$1.txt" 2>&1; head -1 "$W/st_$1.txt" | sed "s|$W/||"
}
tg() { # label depth reps ctk/ctv
  LD_LIBRARY_PATH=$LIBS "$bin/llama-bench" -m "$W/synth.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d "$2" -r "$3" \
    -ctk "${4%/*}" -ctv "${4#*/}" -o csv 2>/dev/null |
    tail -1 | awk -F, -v l="$1" -v d="$2" -v kv="$4" '{gsub(/"/, "", $(NF-1)); print "tg128 d" d " " l " " kv " " $(NF-1)}'
}
