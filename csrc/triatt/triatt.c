/* TriAttention V3: see triatt.h. */
#include "triatt.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TRIATT_F16C 1
#endif

void triatt_config_default(triatt_config *c) {
#define TRIATT_DEFAULT(field, def, flag, hint, help) c->field = def;
#define TRIATT_SKIP(field)
    TRIATT_PARAMS(TRIATT_DEFAULT, TRIATT_SKIP)
#undef TRIATT_DEFAULT
}

const char *triatt_policy_name(int32_t hybrid) {
#define TRIATT_POLICY_NAME(id, flag_name, name)                                                                      \
    if (hybrid == (id)) {                                                                                            \
        return name;                                                                                                 \
    }
    TRIATT_POLICIES(TRIATT_POLICY_NAME)
#undef TRIATT_POLICY_NAME
    return "?";
}

int32_t triatt_policy_from_name(const char *name) {
#define TRIATT_POLICY_ID(id, flag_name, pname)                                                                       \
    if (strcmp(name, flag_name) == 0) {                                                                              \
        return id;                                                                                                   \
    }
    TRIATT_POLICIES(TRIATT_POLICY_ID)
#undef TRIATT_POLICY_ID
    return -1;
}

int triatt_policy_scored(int32_t hybrid) { return hybrid >= 0 && hybrid <= 2; }

int triatt_pool_active(const triatt_config *c, int64_t free_slots) {
    return triatt_policy_scored(c->hybrid) && c->pool > 0 &&
           (c->pool_spans == 0 || free_slots >= (int64_t)c->pool_spans * (2 * (int64_t)c->pool + 1));
}

/* Positions < prefix are protected by V3 and by the baselines (StreamingLLM's attention sinks). */
static int protects_prefix(int32_t hybrid) { return hybrid >= 2; }

/* The cells a full cache never evicts: the window, and the prefix for V3 and the baselines. */
static int64_t protected_cells(const triatt_config *c) {
    return (int64_t)c->window + (protects_prefix(c->hybrid) ? c->prefix : 0);
}

int64_t triatt_free_slots(const triatt_config *c) { return (int64_t)c->budget - protected_cells(c); }

int triatt_config_check(const triatt_config *c, char *msg, size_t msg_size) {
    const struct {
        const char *flag;
        int32_t v;
    } f[] = {
#define TRIATT_VALUE(field, def, flag, hint, help) {flag, c->field},
        TRIATT_PARAMS(TRIATT_VALUE, TRIATT_SKIP)
#undef TRIATT_VALUE
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; ++i) {
        if (f[i].v < 0) {
            snprintf(msg, msg_size, "%s must not be negative (got %d)", f[i].flag, f[i].v);
            return -1;
        }
    }
    if (c->hybrid < 0 || c->hybrid > 4) {
        snprintf(msg, msg_size, "--triatt-policy must be v1, v2, v3, streaming or random (--triatt-hybrid 0-4; got %d)",
                 c->hybrid);
        return -1;
    }
    if (c->segments < 1) {
        snprintf(msg, msg_size, "--triatt-segments must be at least 1 (got %d)", c->segments);
        return -1;
    }
    if (c->budget == 0) {
        return 0;
    }
    const int64_t protect = protected_cells(c);
    if (c->budget <= protect) {
        snprintf(msg, msg_size,
                 "--triatt-budget %d must exceed the protected cells: window %d%s = %lld", c->budget, c->window,
                 protects_prefix(c->hybrid) ? " + prefix" : "", (long long)protect);
        return -1;
    }
    return 0;
}

/* ---- selection ---------------------------------------------------------------------------------------------- */

typedef struct {
    const int32_t *pos;
    const float *score;
} sel_ctx;

static _Thread_local sel_ctx g_sel; /* qsort has no context argument in C11 */

static int by_pos(const void *a, const void *b) {
    const int32_t pa = g_sel.pos[*(const int32_t *)a], pb = g_sel.pos[*(const int32_t *)b];
    return (pa > pb) - (pa < pb);
}

/* Sorts cell indices by position (g_sel.pos); a round's cells usually come in position order already. */
static void sort_by_pos(int32_t *idx, int32_t n) {
    for (int32_t j = 1; j < n; ++j) {
        if (g_sel.pos[idx[j - 1]] > g_sel.pos[idx[j]]) {
            qsort(idx, (size_t)n, sizeof *idx, by_pos);
            return;
        }
    }
}

/* Higher score first; NaN last; ties: older position first. */
static int by_score(const void *a, const void *b) {
    const int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    const float sa = g_sel.score[ia], sb = g_sel.score[ib];
    const int na = isnan(sa), nb = isnan(sb);
    if (na != nb) {
        return na - nb;
    }
    if (!na && sa != sb) {
        return sa < sb ? 1 : -1;
    }
    return (g_sel.pos[ia] > g_sel.pos[ib]) - (g_sel.pos[ia] < g_sel.pos[ib]);
}

/* out[i] = the highest score among the cells within r positions of cell i (NaN only where all of them are NaN). */
static int pool_scores(int32_t n, const int32_t *pos, const float *score, int32_t r, float *out) {
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (ord == NULL) {
        return -1;
    }
    for (int32_t i = 0; i < n; ++i) {
        ord[i] = i;
    }
    g_sel.pos = pos;
    sort_by_pos(ord, n);
    for (int32_t k = 0; k < n; ++k) {
        const int64_t p = pos[ord[k]];
        float m = score[ord[k]];
        for (int32_t j = k - 1; j >= 0 && p - pos[ord[j]] <= r; --j) {
            m = fmaxf(m, score[ord[j]]);
        }
        for (int32_t j = k + 1; j < n && (int64_t)pos[ord[j]] - p <= r; ++j) {
            m = fmaxf(m, score[ord[j]]);
        }
        out[ord[k]] = m;
    }
    free(ord);
    return 0;
}

/* Keeps the k best of the cells cand[0, m) by g_sel.score (reordering them). */
static void take(int32_t *cand, int32_t m, int32_t k, uint8_t *keep) {
    qsort(cand, (size_t)m, sizeof *cand, by_score);
    for (int32_t j = 0; j < k && j < m; ++j) {
        keep[cand[j]] = 1;
    }
}

int32_t triatt_select(const triatt_config *c, int32_t n, const int32_t *pos, const float *score, uint8_t *keep) {
    char msg[160];
    if (n < 0 || triatt_config_check(c, msg, sizeof msg) != 0) {
        return -1;
    }
    if (c->budget == 0 || n <= c->budget) {
        for (int32_t i = 0; i < n; ++i) {
            keep[i] = 1;
        }
        return n;
    }
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)n);
    if (cand == NULL) {
        return -1;
    }
    int32_t pmax = INT32_MIN;
    for (int32_t i = 0; i < n; ++i) {
        pmax = pos[i] > pmax ? pos[i] : pmax;
    }
    int32_t n_cand = 0, n_prot = 0;
    for (int32_t i = 0; i < n; ++i) {
        const int prot = (int64_t)pos[i] > (int64_t)pmax - c->window || (protects_prefix(c->hybrid) && pos[i] < c->prefix);
        keep[i] = (uint8_t)prot;
        n_prot += prot;
        if (!prot) {
            cand[n_cand++] = i;
        }
    }
    int32_t free_slots = c->budget - n_prot; /* > 0: positions are distinct and budget > window (+ prefix) */
    const int pooling = triatt_pool_active(c, free_slots); /* decided on the unclipped free slots */
    if (free_slots > n_cand) {
        free_slots = n_cand;
    }
    float *rank = NULL; /* the baselines' ranking in place of the score */
    if (!triatt_policy_scored(c->hybrid)) {
        rank = malloc(sizeof(float) * (size_t)n);
        if (rank == NULL) {
            free(cand);
            return -1;
        }
        for (int32_t i = 0; i < n; ++i) {
            /* StreamingLLM: newer is better (positions < 2^24 are exact in float); random: 24 bits of a
             * splitmix64 hash of the position (exact in float, ties to the older position) */
            uint64_t z = (uint64_t)(uint32_t)pos[i] + 0x9e3779b97f4a7c15ull * 0x5452u;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            rank[i] = c->hybrid == 3 ? (float)pos[i] : (float)(z >> 40);
        }
    }
    float *pooled = NULL; /* V1-V3 with pool > 0: the neighbourhood's best score in place of the cell's own */
    if (pooling) {
        pooled = malloc(sizeof(float) * (size_t)n);
        if (pooled == NULL || pool_scores(n, pos, score, c->pool, pooled) != 0) {
            free(pooled);
            free(cand);
            return -1;
        }
    }
    g_sel.pos = pos;
    int32_t kept = n_prot;
    if (c->hybrid == 0 || rank) {
        g_sel.score = rank ? rank : (pooled ? pooled : score);
        take(cand, n_cand, free_slots, keep);
        kept += free_slots;
    } else {
        sort_by_pos(cand, n_cand);
        g_sel.score = pooled ? pooled : score;
        const int32_t segs = c->segments < n_cand ? c->segments : (n_cand > 0 ? n_cand : 1);
        int32_t given = 0;
        for (int32_t s = 0; s < segs; ++s) {
            const int32_t lo = (int32_t)((int64_t)n_cand * s / segs), hi = (int32_t)((int64_t)n_cand * (s + 1) / segs);
            const int32_t quota = (int32_t)((int64_t)free_slots * (hi - lo) / n_cand);
            take(cand + lo, hi - lo, quota, keep);
            given += quota;
        }
        /* rounding deficit (< segments slots): the best remaining cells overall */
        int32_t m = 0;
        for (int32_t j = 0; j < n_cand; ++j) {
            if (!keep[cand[j]]) {
                cand[m++] = cand[j];
            }
        }
        take(cand, m, free_slots - given, keep);
        kept += free_slots;
    }
    free(pooled);
    free(rank);
    free(cand);
    return kept;
}

/* ---- score -------------------------------------------------------------------------------------------------- */

void triatt_pair(const triatt_rope *r, int32_t f, int32_t *i_re, int32_t *i_im, double *theta) {
    const int32_t half = r->n_rot / 2;
    if (f < half) {
        *i_re = r->neox ? f : 2 * f;
        *i_im = r->neox ? f + half : 2 * f + 1;
        *theta = r->theta ? r->theta[f] : (double)r->freq_scale * pow((double)r->freq_base, -2.0 * f / r->n_rot);
    } else { /* unrotated tail, paired consecutively */
        *i_re = r->n_rot + 2 * (f - half);
        *i_im = *i_re + 1;
        *theta = 0.0;
    }
}

void triatt_calib_phases(const triatt_rope *r, const int32_t *pos, int32_t n, double *cs, double *sn) {
    const int32_t np = r->head_dim / 2;
    for (int32_t f = 0; f < np; ++f) {
        int32_t a, b;
        double th;
        triatt_pair(r, f, &a, &b, &th);
        for (int32_t i = 0; i < n; ++i) {
            const double ang = -th * pos[i]; /* undo RoPE: multiply by e^{-i theta t} */
            cs[(size_t)f * n + i] = cos(ang);
            sn[(size_t)f * n + i] = sin(ang);
        }
    }
}

void triatt_calib_add_ph(const triatt_rope *r, const float *q, size_t q_stride, int32_t n, const double *cs,
                         const double *sn, double *sum_re, double *sum_im, double *sum_mag) {
    const int32_t np = r->head_dim / 2;
    for (int32_t f = 0; f < np; ++f) {
        int32_t a, b;
        double th;
        triatt_pair(r, f, &a, &b, &th);
        const double *c = cs + (size_t)f * n, *s = sn + (size_t)f * n;
        for (int32_t i = 0; i < n; ++i) {
            const float *row = q + (size_t)i * q_stride;
            const double x = row[a], y = row[b];
            sum_re[f] += x * c[i] - y * s[i];
            sum_im[f] += x * s[i] + y * c[i];
            sum_mag[f] += sqrt(x * x + y * y);
        }
    }
}

int triatt_calib_add(const triatt_rope *r, const float *q, size_t q_stride, const int32_t *pos, int32_t n,
                     double *sum_re, double *sum_im, double *sum_mag) {
    const size_t m = (size_t)(r->head_dim / 2) * (size_t)(n > 0 ? n : 1);
    double *cs = malloc(2 * m * sizeof(double));
    if (cs == NULL) {
        return -1;
    }
    triatt_calib_phases(r, pos, n, cs, cs + m);
    triatt_calib_add_ph(r, q, q_stride, n, cs, cs + m, sum_re, sum_im, sum_mag);
    free(cs);
    return 0;
}

void triatt_weights(const triatt_rope *r, const float *mu_re, const float *mu_im, const float *mag, int32_t max_log2,
                    float *w_re, float *w_im, float *b) {
    const int32_t np = r->head_dim / 2;
    for (int32_t f = 0; f < np; ++f) {
        int32_t ia, ib;
        double th;
        triatt_pair(r, f, &ia, &ib, &th);
        double c_re = 0.0, c_im = 0.0;
        for (int32_t e = 0; e <= max_log2; ++e) {
            const double ang = th * ldexp(1.0, e);
            c_re += cos(ang);
            c_im += sin(ang);
        }
        c_re /= (max_log2 + 1);
        c_im /= (max_log2 + 1);
        const double mr = mu_re[f], mi = mu_im[f], mg = mag[f];
        w_re[f] = (float)(mr * c_re - mi * c_im);
        w_im[f] = (float)(mr * c_im + mi * c_re);
        const double m = hypot(mr, mi);
        b[f] = (float)(mg > m ? mg - m : 0.0);
    }
}

/* n pairs (x[j * stride], y[j * stride]) of one key into the accumulators of pairs f0 .. f0 + n - 1 */
static void fold_pairs(int32_t n, const float *restrict x, const float *restrict y, int32_t stride,
                       const float *restrict w_re, const float *restrict w_im, const float *restrict b,
                       float *restrict z_re, float *restrict z_im, float *restrict c) { /* restrict: vectorizes */
    for (int32_t j = 0; j < n; ++j) {
        const float xv = x[j * stride], yv = y[j * stride];
        z_re[j] += w_re[j] * xv + w_im[j] * yv; /* W conj(k) = (w_re + i w_im)(x - i y) */
        z_im[j] += w_im[j] * xv - w_re[j] * yv;
        c[j] += b[j] * sqrtf(xv * xv + yv * yv);
    }
}

void triatt_fold_key(const triatt_rope *r, const float *w_re, const float *w_im, const float *b, const float *k,
                     float *z_re, float *z_im, float *c) {
    const int32_t half = r->n_rot / 2, np = r->head_dim / 2;
    /* the pairing of triatt_pair: rotated pairs (NEOX: k[f], k[f + half]; else k[2f], k[2f + 1]), then the
     * unrotated tail paired consecutively */
    if (r->neox) {
        fold_pairs(half, k, k + half, 1, w_re, w_im, b, z_re, z_im, c);
    } else {
        fold_pairs(half, k, k + 1, 2, w_re, w_im, b, z_re, z_im, c);
    }
    fold_pairs(np - half, k + r->n_rot, k + r->n_rot + 1, 2, w_re + half, w_im + half, b + half, z_re + half,
               z_im + half, c + half);
}

void triatt_phase(const triatt_rope *r, double t, double *ph_cos, double *ph_sin) {
    const int32_t np = r->head_dim / 2;
    for (int32_t f = 0; f < np; ++f) {
        int32_t ia, ib;
        double th;
        triatt_pair(r, f, &ia, &ib, &th);
        ph_cos[f] = cos(th * t);
        ph_sin[f] = sin(th * t);
    }
}

double triatt_score_folded(int32_t np, const double *ph_cos, const double *ph_sin, const float *z_re, const float *z_im,
                           double c) {
    double s = c;
    for (int32_t f = 0; f < np; ++f) {
        s += ph_cos[f] * z_re[f] - ph_sin[f] * z_im[f];
    }
    return s;
}

/* ---- f16 keys ------------------------------------------------------------------------------------------------ */

/* Exact half -> float without branches on the value (the loop vectorizes): a normal half's exponent is rebased by a
 * multiply, a subnormal's mantissa is read as the fraction of 2^-14 by subtracting a magic number. */
static float f16_to_f32_one(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    uint32_t bits = (two_w >> 4) + (0xE0u << 23);
    float normal, sub;
    memcpy(&normal, &bits, sizeof normal);
    normal *= 0x1.0p-112f;
    bits = (two_w >> 17) | (126u << 23);
    memcpy(&sub, &bits, sizeof sub);
    sub -= 0.5f;
    uint32_t out;
    memcpy(&out, two_w < (1u << 27) ? &sub : &normal, sizeof out);
    out |= sign;
    float f;
    memcpy(&f, &out, sizeof f);
    return f;
}

#ifdef TRIATT_F16C
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *x, float *y, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    }
    for (; i < n; ++i) {
        y[i] = f16_to_f32_one(x[i]);
    }
}
#endif

void triatt_f16_to_f32(const uint16_t *x, float *y, size_t n) {
#ifdef TRIATT_F16C
    if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) {
        f16_to_f32_f16c(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; ++i) {
        y[i] = f16_to_f32_one(x[i]);
    }
}
