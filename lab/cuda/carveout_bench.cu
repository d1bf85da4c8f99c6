// Cost of alternating kernels with different shared-memory needs inside a CUDA graph (decode-step-like chains),
// and whether the shared-memory carveout preference changes it: nvcc -O2 -arch=sm_90 carveout_bench.cu
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void k_small(float * x) { // ~ an rms_norm: one CTA, no shared memory
    x[threadIdx.x] = x[threadIdx.x] * 1.0001f + 1.0f;
}
template <int S>
__global__ void k_smem(float * x) { // one CTA with S bytes of static shared memory, all touched
    __shared__ float sm[S / 4 > 0 ? S / 4 : 1];
    for (int i = threadIdx.x; i < S / 4; i += blockDim.x) sm[i] = x[i % 128];
    __syncthreads();
    if (S > 0) x[threadIdx.x] = sm[(threadIdx.x * 7) % (S / 4 > 0 ? S / 4 : 1)] + 1.0f;
    else x[threadIdx.x] += 1.0f;
}

template <int S>
static int run(float * d, cudaStream_t st, int pairs, int carve, int grid) {
    CK(cudaFuncSetAttribute(k_smem<S>, cudaFuncAttributePreferredSharedMemoryCarveout, carve));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < pairs; ++i) {
        for (int j = 0; j < 5; ++j) k_small<<<grid, 128, 0, st>>>(d);
        k_smem<S><<<grid, 128, 0, st>>>(d);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 20; ++w) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    const int reps = 200;
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    printf("smem %6d B carveout %4d grid %3d: %7.2f us per graph of %d kernels (%.3f us per kernel)\n", S, carve, grid,
           ms * 1000 / reps, pairs * 6, ms * 1000 / reps / (pairs * 6));
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    return 0;
}

int main() {
    float * d; CK(cudaMalloc(&d, 1 << 20)); CK(cudaMemset(d, 0, 1 << 20));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int grid : {1, 8}) {
        for (int carve : {-1, 0, 25, 100}) {
            run<0>(d, st, 16, carve, grid);
            run<1024>(d, st, 16, carve, grid);
            run<8192>(d, st, 16, carve, grid);
            run<16384>(d, st, 16, carve, grid);
            run<22528>(d, st, 16, carve, grid);
            run<32768>(d, st, 16, carve, grid);
            run<45056>(d, st, 16, carve, grid);
        }
    }
    return 0;
}
