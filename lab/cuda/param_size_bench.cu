// Does a kernel's parameter size cost launch time inside a CUDA graph? Chains of 1-CTA kernels (like a decode step's)
// where every sixth kernel takes P bytes of parameters (the TQ kernels pass ~1-1.4 KB: tables and job descriptors):
// nvcc -O2 -arch=sm_90 param_size_bench.cu
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

template <int P> struct blob { unsigned char b[P]; };

__global__ void k_small(float * x) { x[threadIdx.x] = x[threadIdx.x] * 1.0001f + 1.0f; }

template <int P>
__global__ void k_param(const __grid_constant__ blob<P> p, float * x) { // reads a few bytes of its parameters
    x[threadIdx.x] += (float) p.b[(threadIdx.x * 13) % P];
}

template <int P>
static int run(float * d, cudaStream_t st, int every) {
    blob<P> host;
    for (int i = 0; i < P; ++i) host.b[i] = (unsigned char) i;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 96; ++i) {
        if (i % every == every - 1) k_param<P><<<4, 128, 0, st>>>(host, d);
        else k_small<<<4, 128, 0, st>>>(d);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 20; ++w) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int reps = 300;
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    printf("params %5d B on every %d-th of 96 kernels: %7.2f us per graph\n", P, every, ms * 1000 / reps);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return 0;
}

int main() {
    float * d;
    CK(cudaMalloc(&d, 1 << 20));
    CK(cudaMemset(d, 0, 1 << 20));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int rep = 0; rep < 2; ++rep) {
        for (int every : {6, 2}) {
            run<8>(d, st, every);
            run<256>(d, st, every);
            run<1024>(d, st, every);
            run<1536>(d, st, every);
            run<4096>(d, st, every);
        }
    }
    return 0;
}
