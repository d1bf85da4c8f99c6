/* The CPU backend's TQ kernels (csrc/llama.cpp/ggml/src/tq/ggml-tq-cpu.c) against the codec, outside ggml: the SIMD quantizer must
 * produce the codec's bytes exactly, and the rotated-domain dot products must match the codec's within float
 * tolerance. Built by tests/test_c_codec.py once per instruction set the host runs (scalar, AVX2, AVX-512). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-tq-cpu.h"
#include "tq_codec.h"

typedef void (*from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

int main(void) {
    enum { N = 1024, N96 = 1152, ROWS = 400 }; /* N96: whole blocks of 96 */
    static float x[N96], q[N96], qrot[N96], vr[N96], vref[N96];
    static uint8_t a[N96 / TQ_BLOCK_64 * TQ4_64_BLOCK_BYTES], b[N96 / TQ_BLOCK_64 * TQ4_64_BLOCK_BYTES];
    unsigned seed = 99;
    int failures = 0;
    printf("isa %s\n", ggml_tq_cpu_isa());
    for (int bits = 3; bits <= 4; ++bits) {
        const size_t nbytes = N / TQ_BLOCK * tq_block_bytes(bits);
        int mismatched_rows = 0;
        double worst = 0;
        for (int r = 0; r < ROWS; ++r) {
            const float scale = (r % 7 == 0) ? 1e-3f : (r % 5 == 0 ? 300.0f : 1.0f);
            for (int i = 0; i < N; ++i) {
                x[i] = scale * (frand(&seed) + (i % 37 == 0 ? 4.0f * frand(&seed) : 0.0f));
                q[i] = frand(&seed);
            }
            tq_quantize_row(bits, x, a, N);
            (bits == 3 ? ggml_tq3_from_float : ggml_tq4_from_float)(x, b, N);
            mismatched_rows += memcmp(a, b, nbytes) != 0;
            ggml_tq_qrot_from_float(q, qrot, N);
            float got;
            (bits == 3 ? ggml_vec_dot_tq3_qrot : ggml_vec_dot_tq4_qrot)(N, &got, 0, a, 0, qrot, 0, 1);
            const float want = tq_dot_rotated_row(bits, a, qrot, N);
            const double err = fabs((double)got - want) / (fabs((double)want) + 1e-3 * scale);
            worst = err > worst ? err : worst;
            /* FA's V path: rotated rows, un-rotated afterwards, give the codec's dequantization */
            ggml_tq_unrotate_t unrot = NULL;
            ggml_to_float_t to_rot = ggml_tq_fa_v_to_float(bits == 3 ? GGML_TYPE_TQ3 : GGML_TYPE_TQ4, &unrot);
            to_rot(a, vr, N);
            unrot(vr, N);
            tq_dequantize_row(bits, a, vref, N);
            double dmax = 0, rmax = 0;
            for (int i = 0; i < N; ++i) {
                dmax = fmax(dmax, fabs((double)vr[i] - vref[i]));
                rmax = fmax(rmax, fabs((double)vref[i]));
            }
            worst = dmax / rmax > worst ? dmax / rmax : worst;
        }
        printf("tq%d: %d/%d rows differ from the codec's bytes, worst dot / V-row rel err %.2e\n", bits, mismatched_rows,
               ROWS, worst);
        failures += mismatched_rows != 0;
        failures += worst > 1e-4;
    }
    /* the 64- and 96-value blocks: the codec's bytes (the CPU quantizer is the codec), SIMD dot and V rows vs the
     * codec */
    for (int fmt = 0; fmt < 4; ++fmt) {
        const int bits = 3 + (fmt & 1);
        const int nb = fmt < 2 ? TQ_BLOCK_64 : TQ_BLOCK_96;
        const int len = nb == TQ_BLOCK_64 ? N : N96;
        const size_t nbytes = len / nb * tq_block_bytes_n(bits, nb);
        from_float_fn from_float = nb == TQ_BLOCK_64 ? (bits == 3 ? ggml_tq3_64_from_float : ggml_tq4_64_from_float)
                                                         : (bits == 3 ? ggml_tq3_96_from_float : ggml_tq4_96_from_float);
        vec_dot_fn vec_dot = nb == TQ_BLOCK_64 ? (bits == 3 ? ggml_vec_dot_tq3_64_qrot : ggml_vec_dot_tq4_64_qrot)
                                                   : (bits == 3 ? ggml_vec_dot_tq3_96_qrot : ggml_vec_dot_tq4_96_qrot);
        const enum ggml_type type = nb == TQ_BLOCK_64 ? (bits == 3 ? GGML_TYPE_TQ3_64 : GGML_TYPE_TQ4_64)
                                                      : (bits == 3 ? GGML_TYPE_TQ3_96 : GGML_TYPE_TQ4_96);
        int mismatched_rows = 0;
        double worst = 0;
        for (int r = 0; r < ROWS; ++r) {
            const float scale = (r % 7 == 0) ? 1e-3f : (r % 5 == 0 ? 300.0f : 1.0f);
            for (int i = 0; i < len; ++i) {
                x[i] = scale * (frand(&seed) + (i % 37 == 0 ? 4.0f * frand(&seed) : 0.0f));
                q[i] = frand(&seed);
            }
            tq_quantize_row_n(bits, nb, x, a, len);
            from_float(x, b, len);
            mismatched_rows += memcmp(a, b, nbytes) != 0;
            (nb == TQ_BLOCK_64 ? ggml_tq_qrot_64_from_float : ggml_tq_qrot_96_from_float)(q, qrot, len);
            float got;
            vec_dot(len, &got, 0, a, 0, qrot, 0, 1);
            const float want = tq_dot_rotated_row_n(bits, nb, a, qrot, len);
            const double err = fabs((double)got - want) / (fabs((double)want) + 1e-3 * scale);
            worst = err > worst ? err : worst;
            ggml_tq_unrotate_t unrot = NULL;
            ggml_to_float_t to_rot = ggml_tq_fa_v_to_float(type, &unrot);
            to_rot(a, vr, len);
            unrot(vr, len);
            tq_dequantize_row_n(bits, nb, a, vref, len);
            double dmax = 0, rmax = 0;
            for (int i = 0; i < len; ++i) {
                dmax = fmax(dmax, fabs((double)vr[i] - vref[i]));
                rmax = fmax(rmax, fabs((double)vref[i]));
            }
            worst = dmax / rmax > worst ? dmax / rmax : worst;
        }
        printf("tq%d_%d: %d/%d rows differ from the codec's bytes, worst dot / V-row rel err %.2e\n", bits, nb,
               mismatched_rows, ROWS, worst);
        failures += mismatched_rows != 0;
        failures += worst > 1e-4;
    }
    { /* TQ3A: the codec's bytes, and the K dot (SIMD where built) against the codec's */
        int mismatched_rows = 0;
        double worst = 0;
        for (int r = 0; r < ROWS; ++r) {
            const float scale = (r % 7 == 0) ? 1e-3f : (r % 5 == 0 ? 300.0f : 1.0f);
            for (int i = 0; i < N; ++i) {
                x[i] = scale * (frand(&seed) + (i % 37 == 0 ? 4.0f * frand(&seed) : 0.0f)) * (i % 256 < 64 ? 3.0f : 1.0f);
                q[i] = frand(&seed);
            }
            tq3a_quantize_row(x, a, N);
            ggml_tq3a_from_float(x, b, N);
            mismatched_rows += memcmp(a, b, N / TQ3A_BLOCK * TQ3A_BLOCK_BYTES) != 0;
            ggml_tq_qrot_a_from_float(q, qrot, N);
            float got;
            ggml_vec_dot_tq3a_qrot(N, &got, 0, a, 0, qrot, 0, 1);
            const float want = tq3a_dot_rotated_row(a, qrot, N);
            /* relative to the sum of the terms' magnitudes: the SIMD sum runs in another order, and these random dot
             * products cancel to near zero */
            tq3a_dequantize_row_rotated(a, vr, N);
            double mag = 1e-30;
            for (int i = 0; i < N; ++i) {
                mag += fabs((double)vr[i] * qrot[i]);
            }
            const double err = fabs((double)got - want) / mag;
            worst = err > worst ? err : worst;
        }
        printf("tq3a: %d/%d rows differ from the codec's bytes, worst dot error %.2e of the terms' sum\n",
               mismatched_rows, ROWS, worst);
        failures += mismatched_rows != 0;
        failures += worst > 1e-4;
    }
    ggml_tq_unrotate_t unrot = NULL;
    failures += ggml_tq_fa_v_to_float(GGML_TYPE_Q8_0, &unrot) != NULL || unrot != NULL;
    return failures ? 1 : 0;
}
