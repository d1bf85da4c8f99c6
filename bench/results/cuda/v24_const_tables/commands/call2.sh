#!/usr/bin/env bash
# v24 call 2: the tables in constant memory (new) against the parameter copy (old: HEAD 69e32f9's tq/ sources,
# carried in .gpu/old_tq) on one machine: the new build's bin/ is copied aside, the old sources rebuilt in place;
# d0 decode steps traced (kernels) and llama-bench tg128 at d0, new / old x
# f16 / tq3 / tq4 interleaved, 5 rounds of -r 5. A machine without call 1's build builds the new tree first.
export RES=/root/res; mkdir -p $RES
exec > >(tee $OUT/call.log) 2>&1
W=/root/lt
if [ ! -x $W/build/bin/llama-bench ] || ! grep -q tq_c_tab $W/src/ggml/src/ggml-cuda/tq/tq-cuda-codec.cuh; then
  BUILD_TARGETS="llama-bench" bash scripts/gpu/run_cuda.sh build || { tail -30 $RES/build.log; exit 1; }
fi
rm -rf $W/bin_new && cp -r $W/build/bin $W/bin_new
readelf -d $W/bin_new/llama-bench | grep -iE "rpath|runpath"
LD_LIBRARY_PATH=$W/bin_new ldd $W/bin_new/llama-bench | grep -E "ggml-cuda|llama"
cp .gpu/old_tq/* $W/src/ggml/src/ggml-cuda/tq/
(cd $W/build && ninja llama-bench > $W/rb.log 2>&1; tail -1 $W/rb.log)
echo "builds done at ${SECONDS}s"
source bench/results/cuda/v24_const_tables/commands/common.sh # (bin, LIBS set per run below)
new() { bin=$W/bin_new; LIBS=$W/bin_new; }
old() { bin=$W/build/bin; LIBS=$W/build/bin; }
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for kv in tq3/tq3 tq4/tq4; do n=${kv%/*}; for v in new old new old; do $v; trace "k_${v}_$n" $kv; done; done
for r in 1 2 3 4 5; do
  [ $SECONDS -gt 560 ] && { echo "stopped before round $r (time)"; break; }
  for v in new old; do $v; for kv in f16/f16 tq3/tq3 tq4/tq4; do tg $v 0 5 $kv; done; done
done
} 2>&1 | tee $OUT/final.txt
python3 - $OUT/final.txt <<'PY' | tee -a $OUT/final.txt
import statistics, sys
by = {}
for l in open(sys.argv[1]):
    if l.startswith("tg128"):
        r = l.split(); by.setdefault((r[2], r[3]), []).append(float(r[4]))
for (v, kv), x in sorted(by.items()):
    f = by.get((v, "f16/f16"), [])
    rat = [a / b for a, b in zip(x, f)]
    print(f"{v} {kv}: median {statistics.median(x):.1f} t/s over {len(x)}; ratio to f16 of the same build by round: "
          + " ".join(f"{q:.3f}" for q in rat) + f" (median {statistics.median(rat):.3f})")
PY
echo "total ${SECONDS}s"
