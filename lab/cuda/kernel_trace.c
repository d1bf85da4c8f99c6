// LD_PRELOAD tracer: every kernel's GPU start / end (CUPTI concurrent-kernel activity, which also records the
// kernel nodes of CUDA graphs and overlapping PDL launches), dumped at exit to $TRACE_OUT, one line per kernel:
//   start_ns end_ns correlation_id graph_node_id grid_x grid_y grid_z block_x mangled_name
// A graph launch's nodes share its correlation id, so lab/cuda/kernel_trace_stats.py splits a llama-bench run
// into decode steps and says where a step's time goes (what nsys would show; nsys is not on the GPU machine).
// TRACE_API=1 also records the host side, to $TRACE_OUT.api (lab/cuda/step_timeline_stats.py reads both files):
//   R start_ns end_ns correlation_id api_name      (every CUDA runtime API call, host time)
//   M start_ns end_ns correlation_id bytes kind    (memcpy, GPU time; kind 1 HtoD, 2 DtoH, 8 DtoD) / S ... (memset)
// CUPTI puts host and GPU timestamps on one clock, so a token's period splits into host and GPU parts.
// Build: gcc -O2 -shared -fPIC -I$CUDA/include -o kernel_trace.so kernel_trace.c -L$CUPTI_LIB -lcupti
// Run:   TRACE_OUT=t.txt LD_PRELOAD=./kernel_trace.so LD_LIBRARY_PATH=$CUPTI_LIB llama-bench ...
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_MAX 8000000
#define TRACE_BUF (8u << 20)

typedef struct {
    uint64_t start, end, node;
    uint32_t corr;
    int32_t gx, gy, gz, bx;
    const char * name;
} trace_rec;

static trace_rec * recs;
static long n_recs, n_dropped;

typedef struct {
    uint64_t start, end, bytes;
    uint32_t corr, what; // R: the runtime callback id; M / S: the memcpy kind
    char type;           // 'R', 'M' or 'S'
} api_rec;

static api_rec * apis;
static long n_apis;

static void CUPTIAPI buf_requested(uint8_t ** buf, size_t * size, size_t * max_records) {
    *buf = (uint8_t *) aligned_alloc(8, TRACE_BUF);
    *size = *buf ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t * buf, size_t size, size_t valid) {
    (void) ctx;
    (void) stream;
    (void) size;
    CUpti_Activity * r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME || r->kind == CUPTI_ACTIVITY_KIND_MEMCPY ||
            r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            if (apis == NULL || n_apis >= TRACE_MAX) {
                n_dropped++;
                continue;
            }
            api_rec * a = &apis[n_apis++];
            if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
                const CUpti_ActivityAPI * x = (const CUpti_ActivityAPI *) r;
                *a = (api_rec){x->start, x->end, 0, x->correlationId, x->cbid, 'R'};
            } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
                const CUpti_ActivityMemcpy6 * x = (const CUpti_ActivityMemcpy6 *) r;
                *a = (api_rec){x->start, x->end, x->bytes, x->correlationId, x->copyKind, 'M'};
            } else {
                const CUpti_ActivityMemset4 * x = (const CUpti_ActivityMemset4 *) r;
                *a = (api_rec){x->start, x->end, x->bytes, x->correlationId, 0, 'S'};
            }
            continue;
        }
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
            continue;
        }
        const CUpti_ActivityKernel10 * k = (const CUpti_ActivityKernel10 *) r;
        if (n_recs >= TRACE_MAX) {
            n_dropped++;
            continue;
        }
        trace_rec * t = &recs[n_recs++];
        t->start = k->start;
        t->end = k->end;
        t->node = k->graphNodeId;
        t->corr = k->correlationId;
        t->gx = k->gridX;
        t->gy = k->gridY;
        t->gz = k->gridZ;
        t->bx = k->blockX;
        t->name = k->name; // owned by CUPTI, valid for the process's life
    }
    free(buf);
}

__attribute__((constructor)) static void trace_init(void) {
    if (getenv("TRACE_OUT") == NULL) {
        return;
    }
    recs = (trace_rec *) malloc(sizeof(trace_rec) * TRACE_MAX);
    if (recs == NULL || cuptiActivityRegisterCallbacks(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI could not be enabled\n");
        return;
    }
    const char * api = getenv("TRACE_API");
    if (api != NULL && atoi(api) != 0) {
        apis = (api_rec *) malloc(sizeof(api_rec) * TRACE_MAX);
        if (apis == NULL || cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
            cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
            cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
            fprintf(stderr, "kernel_trace: CUPTI API / memcpy activity could not be enabled\n");
        }
    }
}

__attribute__((destructor)) static void trace_dump(void) {
    const char * path = getenv("TRACE_OUT");
    if (path == NULL || recs == NULL) {
        return;
    }
    cuptiActivityFlushAll(1);
    FILE * f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return;
    }
    for (long i = 0; i < n_recs; ++i) {
        const trace_rec * t = &recs[i];
        fprintf(f, "%llu %llu %u %llu %d %d %d %d %s\n", (unsigned long long) t->start, (unsigned long long) t->end,
                t->corr, (unsigned long long) t->node, t->gx, t->gy, t->gz, t->bx, t->name ? t->name : "?");
    }
    fclose(f);
    fprintf(stderr, "kernel_trace: %ld kernels to %s (%ld dropped)\n", n_recs, path, n_dropped);
    if (apis == NULL) {
        return;
    }
    char api_path[4096];
    snprintf(api_path, sizeof(api_path), "%s.api", path);
    f = fopen(api_path, "w");
    if (f == NULL) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", api_path);
        return;
    }
    for (long i = 0; i < n_apis; ++i) {
        const api_rec * a = &apis[i];
        if (a->type == 'R') {
            const char * name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->what, &name) != CUPTI_SUCCESS || name == NULL) {
                name = "?";
            }
            fprintf(f, "R %llu %llu %u %s\n", (unsigned long long) a->start, (unsigned long long) a->end, a->corr, name);
        } else {
            fprintf(f, "%c %llu %llu %u %llu %u\n", a->type, (unsigned long long) a->start, (unsigned long long) a->end,
                    a->corr, (unsigned long long) a->bytes, a->what);
        }
    }
    fclose(f);
    fprintf(stderr, "kernel_trace: %ld API calls / copies to %s\n", n_apis, api_path);
}
