/* C-level codec test, built by tests/test_c_codec.py with AddressSanitizer and UBSan: exercises every
 * entry point on edge inputs, at unaligned addresses, with guard bytes around each output. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tq_codec.h"

static int failures = 0;
#define CHECK(cond, ...)                         \
    do {                                         \
        if (!(cond)) {                           \
            fprintf(stderr, "FAIL: " __VA_ARGS__); \
            fputc('\n', stderr);                 \
            ++failures;                          \
        }                                        \
    } while (0)

static void fill(float *x, int n, unsigned seed, float scale) {
    for (int i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = scale * ((float)(seed >> 8) / 16777216.0f - 0.5f);
    }
}

static void roundtrip(int bits, const float *x, int64_t n, float *out) {
    const size_t bb = tq_block_bytes(bits);
    const size_t nbytes = (size_t)(n / TQ_BLOCK) * bb;
    /* one byte of offset: blocks inside ggml rows are not 4-byte aligned */
    uint8_t *buf = malloc(nbytes + 17);
    memset(buf, 0xA5, nbytes + 17);
    CHECK(tq_quantize_row(bits, x, buf + 1, n) == 0, "quantize_row rejected a valid row");
    CHECK(buf[0] == 0xA5 && buf[nbytes + 1] == 0xA5, "quantize wrote outside its row");
    CHECK(tq_dequantize_row(bits, buf + 1, out, n) == 0, "dequantize_row rejected a valid row");
    free(buf);
}

int main(void) {
    enum { N = 4 * TQ_BLOCK };
    float x[N], y[N];
    for (int bits = 3; bits <= 4; ++bits) {
        fill(x, N, 42u + (unsigned)bits, 2.0f);
        roundtrip(bits, x, N, y);
        double err = 0, ref = 0;
        for (int i = 0; i < N; ++i) {
            err += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ref += (double)x[i] * x[i];
        }
        CHECK(err / ref < (bits == 3 ? 0.05 : 0.015), "tq%d relative error %g too large", bits, err / ref);

        memset(x, 0, sizeof x);
        roundtrip(bits, x, N, y);
        for (int i = 0; i < N; ++i) CHECK(y[i] == 0.0f, "tq%d zero block decoded to %g", bits, y[i]);

        fill(x, N, 7u, 1.0f);
        x[5] = NAN;
        x[TQ_BLOCK + 3] = INFINITY;
        x[2 * TQ_BLOCK] = -INFINITY;
        roundtrip(bits, x, N, y);
        for (int i = 0; i < 3 * TQ_BLOCK; ++i) CHECK(isnan(y[i]), "tq%d poisoned block value %d not NaN", bits, i);
        for (int i = 3 * TQ_BLOCK; i < N; ++i) CHECK(isfinite(y[i]), "tq%d clean block value %d not finite", bits, i);

        for (int i = 0; i < N; ++i) x[i] = (i & 1) ? FLT_MAX : -FLT_MAX;
        roundtrip(bits, x, N, y);
        for (int i = 0; i < N; ++i) CHECK(isfinite(y[i]), "tq%d huge input gave non-finite output", bits);

        for (int i = 0; i < N; ++i) x[i] = 0.0f; /* one value at FLT_MAX per block: the decoded spike stays finite */
        for (int b = 0; b < N / TQ_BLOCK; ++b) x[b * TQ_BLOCK + 17 * b % TQ_BLOCK] = (b & 1) ? -FLT_MAX : FLT_MAX;
        roundtrip(bits, x, N, y);
        for (int i = 0; i < N; ++i) CHECK(isfinite(y[i]), "tq%d a single FLT_MAX decoded to %g", bits, y[i]);

        for (int i = 0; i < N; ++i) x[i] = (i % 3) ? 1e-45f : -1e-45f; /* smallest subnormal */
        roundtrip(bits, x, N, y);
        for (int i = 0; i < N; ++i) CHECK(isfinite(y[i]), "tq%d subnormal input gave non-finite output", bits);

        uint8_t blk[TQ4_BLOCK_BYTES];
        CHECK(tq_quantize_row(bits, x, blk, 100) == -1, "row of 100 values must be rejected");
        CHECK(tq_dequantize_row(bits, blk, y, -128) == -1, "negative length must be rejected");
    }
    CHECK(tq_quantize_row(5, x, y, TQ_BLOCK) == -1, "5 bits must be rejected");
    CHECK(tq_block_bytes(2) == 0 && tq_centroids(2) == NULL, "unsupported bits must give 0 / NULL");
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("c codec edge tests: ok\n");
    return 0;
}
