/* Blocks whose bytes differ between the codec with sequential double sums (old_*, commit 2821450) and the current
 * one with the canonical order: 2^20 random blocks per format (Gaussian at scales 1e-3, 1 and 300, every fifth
 * block offset by 3 scales). Built by run.sh. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tq_codec.h"

int old_tq_quantize_block_n(int bits, int n, const float *x, void *block);

static unsigned long long rng = 88172645463325252ull;

static double u01(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static float gauss(void) {
    const double a = u01(), b = u01();
    return (float)(sqrt(-2.0 * log(a + 1e-300)) * cos(6.283185307179586 * b));
}

int main(void) {
    const int sizes[3] = {128, 64, 96};
    int failures = 0;
    for (int bits = 3; bits <= 4; ++bits) {
        for (int k = 0; k < 3; ++k) {
            const int n = sizes[k];
            const long total = 1L << 20;
            long differ = 0;
            float x[128];
            unsigned char a[80], b[80];
            for (long r = 0; r < total; ++r) {
                const float scale = r % 3 == 0 ? 1e-3f : (r % 3 == 1 ? 1.0f : 300.0f);
                for (int i = 0; i < n; ++i) {
                    x[i] = scale * gauss() + (r % 5 == 0 ? 3.0f * scale : 0.0f);
                }
                failures += old_tq_quantize_block_n(bits, n, x, a) != 0 || tq_quantize_block_n(bits, n, x, b) != 0;
                differ += memcmp(a, b, tq_block_bytes_n(bits, n)) != 0;
            }
            printf("tq%d n=%d: %ld of %ld blocks differ\n", bits, n, differ, total);
        }
    }
    return failures ? 1 : 0;
}
