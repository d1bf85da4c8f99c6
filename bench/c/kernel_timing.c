/* Times the CPU kernels of csrc/llama.cpp/ggml/src/tq/ggml-tq-cpu.c for whichever instruction set they were compiled for: quantize
 * (KV write), rotated-domain K.Q dot, rotated V row decode. One line of JSON per (type, kernel). Built and run
 * once per ISA by bench/kernel_isa.py. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ggml-tq-cpu.h"
#include "tq_codec.h"

enum { N = 256, ROWS = 4096 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* Best of `reps` timings of the loop, in ns per row. */
#define TIME_NS_PER_ROW(reps, body)                                  \
    ({                                                               \
        double best_ = 1e30;                                         \
        for (int rep_ = 0; rep_ < (reps); ++rep_) {                  \
            const double t0_ = now();                                \
            for (int r = 0; r < ROWS; ++r) { body; }                 \
            const double dt_ = (now() - t0_) * 1e9 / ROWS;           \
            best_ = dt_ < best_ ? dt_ : best_;                       \
        }                                                            \
        best_;                                                       \
    })

int main(void) {
    float *x = malloc(sizeof(float) * N * ROWS), *q = malloc(sizeof(float) * N), *qrot = malloc(sizeof(float) * N);
    float *v = malloc(sizeof(float) * N);
    uint8_t *blocks = malloc((size_t)ROWS * N / TQ_BLOCK * TQ4_BLOCK_BYTES);
    unsigned seed = 7;
    for (int i = 0; i < N * ROWS; ++i) x[i] = frand(&seed);
    for (int i = 0; i < N; ++i) q[i] = frand(&seed);
    ggml_tq_qrot_from_float(q, qrot, N);
    volatile float sink = 0;
    for (int bits = 3; bits <= 4; ++bits) {
        const size_t rb = N / TQ_BLOCK * tq_block_bytes(bits);
        ggml_from_float_t quant = bits == 3 ? ggml_tq3_from_float : ggml_tq4_from_float;
        void (*dot)(int, float *, size_t, const void *, size_t, const void *, size_t, int) = bits == 3 ? ggml_vec_dot_tq3_qrot : ggml_vec_dot_tq4_qrot;
        ggml_to_float_t vrow = bits == 3 ? ggml_tq3_to_float_rotated : ggml_tq4_to_float_rotated;
        const double tq = TIME_NS_PER_ROW(3, quant(x + (size_t)r * N, blocks + r * rb, N));
        const double td = TIME_NS_PER_ROW(20, {
            float s;
            dot(N, &s, 0, blocks + r * rb, 0, qrot, 0, 1);
            sink += s;
        });
        const double tv = TIME_NS_PER_ROW(20, {
            vrow(blocks + r * rb, v, N);
            sink += v[r % N];
        });
        printf("{\"isa\": \"%s\", \"type\": \"tq%d\", \"head\": %d, \"quantize_ns\": %.1f, \"dot_ns\": %.1f, "
               "\"v_row_ns\": %.1f}\n", ggml_tq_cpu_isa(), bits, N, tq, td, tv);
    }
    (void)sink;
    free(x), free(q), free(qrot), free(v), free(blocks);
    return 0;
}
