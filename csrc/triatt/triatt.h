/* TriAttention V3 KV eviction (arXiv:2604.04921 + the V3 policy): the algorithms, C11, no ggml/llama dependency.
 *
 * Score. Pre-RoPE queries of a head concentrate around a fixed complex centre mu_f per RoPE frequency pair f
 * (calibrated from the first `warmup` tokens). A future query at position t then gives a cached key k (post-RoPE,
 * as stored in the cache) the expected logit sum_f Re(mu_f e^{i theta_f t} conj(k_f)). Averaged over geometric
 * future offsets t = t_now + D, D = 1, 2, 4, ..., 2^max_log2, this is sum_f Re(A_f conj(k_f)) with
 * A_f = mu_f * mean_D e^{i theta_f (t_now + D)}. The query magnitude not explained by the centre adds
 * (mean|q_f| - |mu_f|) |k_f|. Scores are summed over attention layers and KV heads (GQA query heads averaged into
 * their KV head). Since A_f(t) = e^{i theta_f t} A_f(0), a key is folded once into a per-pair state when it is
 * first scored, and each later round only turns that state by the round's phase (triatt_fold_key below).
 *
 * Selection (per sequence, when it holds more than budget + divide cells; back to `budget`):
 *   protected: the last `window` positions; with hybrid = 2 (V3) also positions < `prefix`;
 *   hybrid 0 (V1): the highest-scoring other cells fill the budget;
 *   hybrid 1 (V2) / 2 (V3): the other cells, in position order, are cut into `segments` equal parts, each keeps
 *   floor(share) of the free slots by score; the slots lost to rounding go to the best remaining cells overall.
 *   With pool = r > 0 (V1-V3), a cell is ranked by the highest score within r positions of it (SnapKV-style max
 *   pooling) instead of its own: a span of text around a high-scoring token (a fact such as a name with its number)
 *   is kept or evicted as a whole rather than in fragments (bench/results/v3_eviction.md: needle recall at a 50 %
 *   budget 0-1/5 -> 4-5/5, for some 10-40 % more KLD; the midpoint of own and pooled score, or half the slots by
 *   each, kept more KLD but lost the needle; pooling only toward the strongest peaks had less KLD but lost needles at 8k,
 *   and was removed). Pooling spends slots on a peak's neighbours,
 *   which a small budget cannot afford: with pool_spans = S > 0 a round pools only when its free slots hold S spans
 *   of 2 pool + 1 cells (default 96: 1632 slots at pool 8; measured in bench/results/v3_eviction.md).
 *   Baselines that ignore the score (prefix protected as in V3): hybrid 3 = StreamingLLM (attention sinks =
 *   the prefix, then the most recent cells fill the budget), hybrid 4 = random (the other cells ranked by a fixed
 *   hash of their position: a uniform, reproducible choice that keeps a kept cell ranked high in later rounds).
 * Every step is a sort: O(n log n).
 */
#ifndef TRIATT_H
#define TRIATT_H

#include <stddef.h>
#include <stdint.h>

#include "triatt_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The settings (triatt_params.h: budget, hybrid = the policy, prefix, window, segments, divide, warmup,
 * boundary_skip, pool, pool_spans; a retired slot has no field here). */
typedef struct triatt_config {
#define TRIATT_CONFIG_FIELD(field, def, flag, hint, help) int32_t field;
#define TRIATT_CONFIG_RETIRED(field)
    TRIATT_PARAMS(TRIATT_CONFIG_FIELD, TRIATT_CONFIG_RETIRED)
#undef TRIATT_CONFIG_FIELD
#undef TRIATT_CONFIG_RETIRED
} triatt_config;

/* The defaults of triatt_params.h. */
void triatt_config_default(triatt_config *c);

/* The policy's name: "V1", "V2", "V3", "StreamingLLM", "random" ("?" outside 0..4). */
const char *triatt_policy_name(int32_t hybrid);

/* The policy of a --triatt-policy name (v1, v2, v3, streaming, random), or -1. */
int32_t triatt_policy_from_name(const char *name);

/* Whether the policy ranks cells by the TriAttention score (V1-V3) rather than by position alone. */
int triatt_policy_scored(int32_t hybrid);

/* Whether a round with `free_slots` unprotected slots ranks by pooled scores: a scored policy, pool > 0 and
 * (pool_spans == 0 or free_slots >= pool_spans * (2 pool + 1)). */
int triatt_pool_active(const triatt_config *c, int64_t free_slots);

/* The free slots a round has once the cache is full: budget minus window, minus prefix for V3 and the baselines. */
int64_t triatt_free_slots(const triatt_config *c);

/* 0 if usable, else -1 with a message: negative values, hybrid outside 0..4, segments < 1, and a budget that does
 * not exceed the protected cells (window, plus prefix for V3 and the baselines). budget 0 is valid (off). */
int triatt_config_check(const triatt_config *c, char *msg, size_t msg_size);

/* Chooses the cells of one sequence to keep: n cells with distinct positions pos[i] and scores score[i]; writes
 * keep[i] = 1 (keep) or 0 (evict). Returns the number kept (min(n, budget)), or -1 if the config is invalid or
 * memory runs out (keep untouched). Deterministic: ties go to the older position. */
int32_t triatt_select(const triatt_config *c, int32_t n, const int32_t *pos, const float *score, uint8_t *keep);

/* RoPE as the model applies it. Pair f of a head (f < n_rot/2) is (x[2f], x[2f+1]) normally, (x[f], x[f+n_rot/2])
 * for NEOX, rotated by theta_f * position with theta_f = freq_scale * freq_base^(-2f/n_rot). Dimensions beyond
 * n_rot are unrotated and paired consecutively (theta = 0). */
typedef struct triatt_rope {
    int32_t head_dim;
    int32_t n_rot;
    int32_t neox;
    float freq_base;
    float freq_scale;
    const double *theta; /* optional: the n_rot/2 angles per position (e.g. with per-dimension frequency factors) */
} triatt_rope;

/* The (re, im) indices of pair f and its angle per position. */
void triatt_pair(const triatt_rope *r, int32_t f, int32_t *i_re, int32_t *i_im, double *theta);

/* Calibration: adds n query rows (post-RoPE, one head, row stride q_stride floats, positions pos) un-rotated to
 * pre-RoPE into per-pair sums of the complex value and of its magnitude (head_dim/2 doubles each). 0, or -1 when out
 * of memory. */
int triatt_calib_add(const triatt_rope *r, const float *q, size_t q_stride, const int32_t *pos, int32_t n,
                     double *sum_re, double *sum_im, double *sum_mag);

/* The same in two steps, so that heads and layers with the same angles share the phases: cs / sn get
 * cos / sin(-theta_f pos[i]) at [f * n + i] (head_dim/2 * n doubles each), then triatt_calib_add_ph adds the rows
 * (the same sums as triatt_calib_add). */
void triatt_calib_phases(const triatt_rope *r, const int32_t *pos, int32_t n, double *cs, double *sn);
void triatt_calib_add_ph(const triatt_rope *r, const float *q, size_t q_stride, int32_t n, const double *cs,
                         const double *sn, double *sum_re, double *sum_im, double *sum_mag);

/* A key's score at round time t, s(t) = sum_f Re(A_f(t) conj(k_f)) + B_f |k_f| with A_f(t) = mu_f mean_D e^{i theta_f
 * (t + D)}, D in {1, 2, 4, ..., 2^max_log2}, factors into a phase of the round and a state fixed when the key is stored:
 *   A_f(t) = e^{i theta_f t} W_f,  W_f = mu_f mean_D e^{i theta_f D},  B_f = mag_f - |mu_f| (0 if negative);
 *   s(t) = c + sum_f Re(e^{i theta_f t} z_f),  z_f = sum over the scored (layer, KV head)s of W_f conj(k_f),
 *   c = the sum of B_f |k_f| over them.
 * So a cached key is read, decoded and folded once (head_dim/2 complex values and a constant, whatever the number of
 * layers and heads that share theta), and a round costs head_dim/2 complex multiply-adds per key. */

/* W (re, im) and B of one (layer, KV head) from its calibration means (mu, mean magnitude): head_dim/2 each. */
void triatt_weights(const triatt_rope *r, const float *mu_re, const float *mu_im, const float *mag, int32_t max_log2,
                    float *w_re, float *w_im, float *b);

/* Folds one post-RoPE key of a head into per-pair accumulators (head_dim/2 floats each): z_re[f] += Re(W_f conj(k_f)),
 * z_im[f] += Im(W_f conj(k_f)), c[f] += B_f |k_f| (c is summed over the pairs once the key's heads are all folded).
 * Every pair accumulates separately, so the loops vectorize. */
void triatt_fold_key(const triatt_rope *r, const float *w_re, const float *w_im, const float *b, const float *k,
                     float *z_re, float *z_im, float *c);

/* The round's phases: ph_cos[f] = cos(theta_f t), ph_sin[f] = sin(theta_f t) (head_dim/2 pairs). */
void triatt_phase(const triatt_rope *r, double t, double *ph_cos, double *ph_sin);

/* A folded key's score: c + sum_f Re((ph_cos[f] + i ph_sin[f]) (z_re[f] + i z_im[f])) over np pairs. */
double triatt_score_folded(int32_t np, const double *ph_cos, const double *ph_sin, const float *z_re, const float *z_im,
                           double c);

/* IEEE half -> float for n values (a round reads f16 keys): F16C where the CPU has it (checked at run time), else a
 * portable exact conversion. Every half, subnormals, infinities and NaNs included, maps to the float it denotes. */
void triatt_f16_to_f32(const uint16_t *x, float *y, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TRIATT_H */
