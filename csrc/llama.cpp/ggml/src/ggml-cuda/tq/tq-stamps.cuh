// In-graph timestamps of the fused K/V write and the tensor-core FA kernel (a build with -DTQ_STAMPS only; without
// it every macro here is empty). CUPTI sees a kernel's start and end; these see inside it, on the GPU's global
// timer, so a write and the FA kernel that waits for it (PDL) line up: which FA phase runs long, and when its wait
// for the write returns. Each translation unit keeps its own ring of launches (one slot a launch: blocks read the
// slot at entry, the last block to leave moves to the next one) and writes it at exit to
// $TQ_STAMPS_OUT.<unit>.<pid> (one line a launch); lab/cuda/stamps_stats.py lines up the write and FA files.
#pragma once

#ifdef TQ_STAMPS
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#define TQ_STAMP_SLOTS 8192
#define TQ_STAMP_FIELDS 8

struct tq_stamp_ring {
    unsigned seq;  // launches completed
    unsigned done; // blocks of the current launch that have left
    unsigned long long t[TQ_STAMP_SLOTS][TQ_STAMP_FIELDS];
};
static __device__ tq_stamp_ring tq_stamp_dev;

static __device__ __forceinline__ unsigned long long tq_stamp_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ unsigned tq_stamp_slot() {
    return *(volatile unsigned *) &tq_stamp_dev.seq % TQ_STAMP_SLOTS;
}
// field f of the launch: the block-0 value (block0), the first over all blocks (min: stored inverted, so that a
// zeroed ring works with atomicMax), or the last (max)
static __device__ __forceinline__ void tq_stamp_block0(unsigned slot, int f) {
    if (threadIdx.x == 0 && blockIdx.x + blockIdx.y + blockIdx.z == 0) {
        tq_stamp_dev.t[slot][f] = tq_stamp_now();
    }
}
static __device__ __forceinline__ void tq_stamp_min(unsigned slot, int f) {
    if (threadIdx.x == 0) {
        atomicMax(&tq_stamp_dev.t[slot][f], ~tq_stamp_now());
    }
}
static __device__ __forceinline__ void tq_stamp_max(unsigned slot, int f) {
    if (threadIdx.x == 0) {
        atomicMax(&tq_stamp_dev.t[slot][f], tq_stamp_now());
    }
}
// at a block's exit (every thread): the last block clears the next slot and moves the ring on
static __device__ __forceinline__ void tq_stamp_leave(unsigned slot) {
    __syncthreads();
    if (threadIdx.x == 0) {
        tq_stamp_max(slot, TQ_STAMP_FIELDS - 1);
        __threadfence();
        const unsigned nb = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(&tq_stamp_dev.done, 1u) == nb - 1) {
            const unsigned next = (slot + 1) % TQ_STAMP_SLOTS;
            for (int f = 0; f < TQ_STAMP_FIELDS; ++f) {
                tq_stamp_dev.t[next][f] = 0ull;
            }
            tq_stamp_dev.done = 0u;
            __threadfence();
            atomicAdd(&tq_stamp_dev.seq, 1u);
        }
    }
}

static void tq_stamps_dump() {
    const char * out = getenv("TQ_STAMPS_OUT");
    if (out == nullptr) {
        return;
    }
    static tq_stamp_ring h;
    const cudaError_t err = cudaMemcpyFromSymbol(&h, tq_stamp_dev, sizeof(h));
    if (err != cudaSuccess) {
        fprintf(stderr, "TQ_STAMPS (%s): %s\n", __BASE_FILE__, cudaGetErrorString(err));
        return;
    }
    const char * unit = __BASE_FILE__;
    for (const char * c = unit; *c; ++c) {
        if (*c == '/') {
            unit = c + 1;
        }
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s.%s.%d", out, unit, (int) getpid());
    FILE * f = fopen(path, "w");
    if (f == nullptr) {
        return;
    }
    const unsigned n = h.seq < TQ_STAMP_SLOTS ? h.seq : TQ_STAMP_SLOTS;
    fprintf(f, "# %s: %u launches, the last %u: slot, then %d fields (ns; 0: not set)\n", unit, h.seq, n,
            TQ_STAMP_FIELDS);
    for (unsigned i = h.seq - n; i < h.seq; ++i) {
        const unsigned s = i % TQ_STAMP_SLOTS;
        fprintf(f, "%u", i);
        for (int k = 0; k < TQ_STAMP_FIELDS; ++k) {
            const unsigned long long v = h.t[s][k];
            fprintf(f, " %llu", v > (1ull << 63) ? ~v : v);
        }
        fputc('\n', f);
    }
    fclose(f);
}
// registered at a unit's first launch, after the CUDA runtime's own exit handler: so it runs before that one
static void tq_stamps_register() {
    static bool done = false;
    if (!done) {
        done = true;
        atexit(tq_stamps_dump);
    }
}
#define TQ_STAMP_ENTER() const unsigned tq_stamp_s_ = tq_stamp_slot()
#define TQ_STAMP_BLOCK0(f) tq_stamp_block0(tq_stamp_s_, f)
#define TQ_STAMP_MIN(f) tq_stamp_min(tq_stamp_s_, f)
#define TQ_STAMP_MAX(f) tq_stamp_max(tq_stamp_s_, f)
#define TQ_STAMP_LEAVE() tq_stamp_leave(tq_stamp_s_)
#define TQ_STAMPS_REGISTER() tq_stamps_register()
#else
#define TQ_STAMP_ENTER() ((void) 0)
#define TQ_STAMP_BLOCK0(f) ((void) 0)
#define TQ_STAMP_MIN(f) ((void) 0)
#define TQ_STAMP_MAX(f) ((void) 0)
#define TQ_STAMP_LEAVE() ((void) 0)
#define TQ_STAMPS_REGISTER() ((void) 0)
#endif
