/* The element-wise work between a quantised layer's matrix products, one call each where
 * torch needs several ops (and a dispatch, an allocation and a pass over memory for each).
 *
 * A quantised decoder layer runs four int4/int8 products on bfloat16 activations (float32
 * in the exactness runs). Between
 * them torch's path casts bf16 -> float32, adds the residual, normalises (6 ATen ops inside
 * `rms_norm`), casts back to bf16, rotates q and k (a complex multiply), scatters K/V into
 * the cache and applies SwiGLU: about 25 ops a layer, 55% of a batch-1 SmolLM2 step on a
 * 2-core host. Here each stretch is one pass:
 *
 *   tr_add_rmsnorm       h += y; x = rmsnorm(h) * w (y and x bf16 or float32)
 *   tr_silu_mul          act = silu(gate) * up from the fused gate|up product
 *   tr_rope_write        q, k (optionally per-head RMSNorm first, Qwen3) rotated, K/V
 *                        written to their cache slots, q written out in float32
 *
 * Arithmetic is float32 (the sum of squares in double), one row at a time, in an order that
 * depends only on the row: a row's results are the same bits whatever else shares the call,
 * so the engine's batch invariance holds. The values differ from torch's by float rounding
 * (other reduction order, other exp), which tests bound. Rows are split among OpenMP threads
 * only when a call has many of them (prefill chunks); a decode step's few rows would pay more
 * for waking threads than they cost.
 *
 * bfloat16 is stored as uint16 (the high half of a float32); float -> bf16 rounds to nearest
 * even, as torch does, and keeps NaN a NaN.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "vexp.h"

/* rows x columns below this run on one thread */
#define PARALLEL_MIN 65536

static inline float bf16_to_f32(uint16_t b) {
    const uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, whatever its payload */
        return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float load_any(const void *p, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* 1 / sqrt(mean(x^2) + eps) over n floats, the squares summed in double in index order */
static inline float inv_rms(const float *x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

static inline void store_any(void *p, int64_t i, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* For each of `rows` rows of `cols` floats: h += y when y is given (bf16 if y_bf16, else
 * float32); then, when out is given, out = (h * inv_rms(h)) * w, stored as bf16 if out_bf16,
 * else float32. */
void tr_add_rmsnorm(float *h, int64_t h_stride, const void *y, int y_bf16, int64_t y_stride, const float *w,
                    float eps, void *out, int out_bf16, int64_t out_stride, int64_t rows, int64_t cols,
                    int64_t threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * cols >= PARALLEL_MIN)
#endif
    for (int64_t r = 0; r < rows; r++) {
        float *hr = h + r * h_stride;
        if (y) {
            if (y_bf16) {
                const uint16_t *yr = (const uint16_t *)y + r * y_stride;
                for (int64_t i = 0; i < cols; i++)
                    hr[i] += bf16_to_f32(yr[i]);
            } else {
                const float *yr = (const float *)y + r * y_stride;
                for (int64_t i = 0; i < cols; i++)
                    hr[i] += yr[i];
            }
        }
        if (out) {
            const float s = inv_rms(hr, cols, eps);
            if (out_bf16) {
                uint16_t *o = (uint16_t *)out + r * out_stride;
                for (int64_t i = 0; i < cols; i++)
                    o[i] = f32_to_bf16((hr[i] * s) * w[i]);
            } else {
                float *o = (float *)out + r * out_stride;
                for (int64_t i = 0; i < cols; i++)
                    o[i] = (hr[i] * s) * w[i];
            }
        }
    }
}

/* act[r, i] = silu(g) * u with g = gu[r, i], u = gu[r, inter + i], silu(g) = g / (1 + exp(-g));
 * gu and act each bf16 or float32 (their flags). */
void tr_silu_mul(const void *gu, int gu_bf16, int64_t gu_stride, void *act, int act_bf16, int64_t act_stride,
                 int64_t rows, int64_t inter, int64_t threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * inter >= PARALLEL_MIN)
#endif
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g = r * gu_stride, a = r * act_stride;
        if (gu_bf16 && act_bf16) { /* the common case, kept free of per-element branches */
            const uint16_t *gr = (const uint16_t *)gu + g, *ur = gr + inter;
            uint16_t *ar = (uint16_t *)act + a;
            for (int64_t i = 0; i < inter; i++) {
                const float x = bf16_to_f32(gr[i]);
                ar[i] = f32_to_bf16(x / (1.0f + tr_exp(-x)) * bf16_to_f32(ur[i]));
            }
        } else if (!gu_bf16 && !act_bf16) {
            const float *gr = (const float *)gu + g, *ur = gr + inter;
            float *ar = (float *)act + a;
            for (int64_t i = 0; i < inter; i++)
                ar[i] = gr[i] / (1.0f + tr_exp(-gr[i])) * ur[i];
        } else {
            for (int64_t i = 0; i < inter; i++) {
                const float x = load_any(gu, g + i, gu_bf16);
                store_any(act, a + i, x / (1.0f + tr_exp(-x)) * load_any(gu, g + inter + i, gu_bf16), act_bf16);
            }
        }
    }
}

/* n floats into a cache row of type kv_type (0 float32, 1 float16, 2 bfloat16; both rounded
 * to nearest even, as torch's casts) */
static inline void store_kv(void *kv, int kv_type, int64_t at, const float *src, int64_t n) {
    if (kv_type == 0) {
        memcpy((float *)kv + at, src, sizeof(float) * (size_t)n);
    } else if (kv_type == 1) {
        _Float16 *d = (_Float16 *)kv + at;
        for (int64_t i = 0; i < n; i++)
            d[i] = (_Float16)src[i];
    } else {
        uint16_t *d = (uint16_t *)kv + at;
        for (int64_t i = 0; i < n; i++)
            d[i] = f32_to_bf16(src[i]);
    }
}

/* One token's q|k|v row (heads * hd + 2 * kv_heads * hd values, bf16 if qkv_bf16, else float32;
 * each q/k head's dimensions interleaved as (re, im) pairs, `layers.interleave`):
 *   - q and k heads: optionally RMSNorm over the head times qk_norm's row for it (Qwen3), then
 *     rotated by cis[pos] (hd / 2 (cos, sin) pairs): (re, im) -> (re c - im s, re s + im c);
 *   - q written to q_out (heads * hd floats a row, q_stride apart);
 *   - k and v written at their slot of the cache layer [2 * kv_heads, slots, hd] (K heads, then V),
 *     whose elements are of type kv_type (0 float32, 1 float16, 2 bfloat16).
 * qk_norm: [heads + kv_heads, hd] (q rows then k rows) or NULL. */
void tr_rope_write(const void *qkv, int qkv_bf16, int64_t qkv_stride, int64_t rows, int64_t heads,
                   int64_t kv_heads, int64_t hd, const float *cis, const int64_t *positions,
                   const float *qk_norm, float eps, void *kv, int kv_type, int64_t slots_per_head,
                   const int64_t *slots, float *q_out, int64_t q_stride, int64_t threads) {
    const int64_t half = hd / 2;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * (heads + 2 * kv_heads) * hd >= PARALLEL_MIN)
#endif
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cis + positions[r] * hd;
        float head[1024], rot[1024];
        for (int64_t hh = 0; hh < heads + 2 * kv_heads; hh++) {
            const int64_t base = r * qkv_stride + hh * hd;
            for (int64_t d = 0; d < hd; d++)
                head[d] = load_any(qkv, base + d, qkv_bf16);
            /* K heads are the cache's first kv_heads, V heads the next */
            const int64_t at = ((hh - heads) * slots_per_head + slots[r]) * hd;
            if (hh >= heads + kv_heads) { /* a V head: stored as it is */
                store_kv(kv, kv_type, at, head, hd);
                continue;
            }
            if (qk_norm) {
                const float s = inv_rms(head, hd, eps);
                const float *wn = qk_norm + hh * hd;
                for (int64_t d = 0; d < hd; d++)
                    head[d] = (head[d] * s) * wn[d];
            }
            float *dst = hh < heads ? q_out + r * q_stride + hh * hd : rot;
            for (int64_t j = 0; j < half; j++) {
                const float re = head[2 * j], im = head[2 * j + 1];
                const float cs = c[2 * j], sn = c[2 * j + 1];
                dst[2 * j] = re * cs - im * sn;
                dst[2 * j + 1] = re * sn + im * cs;
            }
            if (hh >= heads)
                store_kv(kv, kv_type, at, rot, hd);
        }
    }
}
