// LD_PRELOAD shim: timestamps of cudaGraphLaunch / cudaStreamSynchronize calls, dumped at exit
// to $SHIM_OUT (one line per call: kind start_us end_us), to split a decode step into host and GPU-wait time
// (lab/cuda/step_shim_stats.py). gcc -O2 -shared -fPIC -o step_shim.so step_shim.c -ldl; then
// SHIM_OUT=steps.txt LD_PRELOAD=./step_shim.so llama-bench ... (libggml-cuda links libcudart dynamically).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int cudaError_t;
typedef void * cudaStream_t;
typedef void * cudaGraphExec_t;
#define MAXEV 4000000
static double * ev_a, * ev_b;
static char * ev_k;
static long n_ev;
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}
static void rec(char k, double a, double b) {
    if (!ev_a) {
        ev_a = malloc(sizeof(double) * MAXEV);
        ev_b = malloc(sizeof(double) * MAXEV);
        ev_k = malloc(MAXEV);
    }
    if (n_ev < MAXEV) {
        ev_a[n_ev] = a; ev_b[n_ev] = b; ev_k[n_ev] = k; n_ev++;
    }
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    static cudaError_t (*real)(cudaStream_t);
    if (!real) real = (cudaError_t (*)(cudaStream_t)) dlsym(RTLD_NEXT, "cudaStreamSynchronize");
    double a = now_us();
    cudaError_t r = real(s);
    rec('S', a, now_us());
    return r;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
    static cudaError_t (*real)(cudaGraphExec_t, cudaStream_t);
    if (!real) real = (cudaError_t (*)(cudaGraphExec_t, cudaStream_t)) dlsym(RTLD_NEXT, "cudaGraphLaunch");
    double a = now_us();
    cudaError_t r = real(g, s);
    rec('G', a, now_us());
    return r;
}
__attribute__((destructor)) static void dump(void) {
    const char * p = getenv("SHIM_OUT");
    if (!p) return;
    FILE * f = fopen(p, "w");
    if (!f) return;
    for (long i = 0; i < n_ev; ++i) fprintf(f, "%c %.1f %.1f\n", ev_k[i], ev_a[i], ev_b[i]);
    fclose(f);
}
