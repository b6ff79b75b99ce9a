/* Paged attention for decode and short extends, reading each request's K/V blocks where
 * they lie in the cache (no gather); q, scores and output float32, the cache float32, float16
 * or bfloat16 (`kv_type`: each K/V element widened to float32 as it is read, exactly).
 *
 * Built by ckernels.py on the host that runs it (cc -O3 -march=native) and called through
 * ctypes. Every query token is computed on its own, in a fixed order that depends only on
 * that token (its request's blocks and its number of keys), so a token's output is the same
 * bits whatever else shares the call: the batch invariance the engine promises. With OpenMP
 * (built with -fopenmp, loaded after torch so both share torch's libgomp and its threads),
 * the (token, KV head) tasks are split among `threads`; each task is still one thread's,
 * start to end, so the split changes no bits.
 *
 * Cache layout of one layer: [2 * kv_heads, num_blocks, block_size, head_dim], K heads then
 * V heads; position j of a request lies in block tables[j / block_size], row j % block_size.
 *
 * Vector code uses GCC/Clang vector extensions (8 floats), which the compiler lowers to the
 * host's instructions; loops over the query heads sharing a KV head are compiled for each
 * group size 1..8 (`attend_group`), so their accumulators live in registers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "kernels.h"
#include "vexp.h"

#define LANES 16
#define MAX_GROUP 8

typedef float v8 __attribute__((vector_size(32)));
typedef _Float16 h8 __attribute__((vector_size(16)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* the cache's element types (`kv_type`) */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2 };
static const int64_t KV_BYTES[3] = {4, 2, 2};

/* 8 cache elements from index i of `base`, as float32 (exact for every type) */
static inline v8 load8kv(const void *base, int64_t i, const int kvt) {
    v8 v;
    if (kvt == KV_F32) {
        memcpy(&v, (const float *)base + i, sizeof v);
    } else if (kvt == KV_F16) {
#ifdef __F16C__ /* one instruction (the generic conversion below goes element by element) */
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
        memcpy(&v, &f, sizeof v);
#else
        h8 h;
        memcpy(&h, (const _Float16 *)base + i, sizeof h);
        v = __builtin_convertvector(h, v8);
#endif
    } else {
        u16x8 b;
        memcpy(&b, (const uint16_t *)base + i, sizeof b);
        const u32x8 w = __builtin_convertvector(b, u32x8) << 16;
        memcpy(&v, &w, sizeof v);
    }
    return v;
}

static inline float kv_at(const void *base, int64_t i, int kvt) {
    if (kvt == KV_F32)
        return ((const float *)base)[i];
    if (kvt == KV_F16)
        return (float)((const _Float16 *)base)[i];
    const uint32_t w = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v); /* an unaligned vector load */
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

static inline float hsum8(v8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

/* the largest of s[0:n] (max is exact, so the lanes change nothing) */
static float max_of(const float *s, int64_t n) {
    float acc[LANES];
    for (int l = 0; l < LANES; l++)
        acc[l] = -INFINITY;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] = s[j + l] > acc[l] ? s[j + l] : acc[l];
    for (; j < n; j++)
        acc[0] = s[j] > acc[0] ? s[j] : acc[0];
    float m = acc[0];
    for (int l = 1; l < LANES; l++)
        m = acc[l] > m ? acc[l] : m;
    return m;
}

/* s[j] = exp(s[j] - m) / sum for j < n (the sum added in a fixed order; `tr_exp`). */
static void softmax_shifted(float *restrict s, int64_t n, float m) {
    for (int64_t j = 0; j < n; j++)
        s[j] = tr_exp(s[j] - m);
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += s[j + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    float sum = acc[0];
    for (; j < n; j++)
        sum += s[j];
    const float inv = 1.0f / sum;
    for (j = 0; j < n; j++)
        s[j] *= inv;
}

/* One token, one KV head, the G query heads sharing it (q: G rows of head_dim; out likewise):
 * scores block by block (each key row read once for all G heads, each sum kept in 8 lanes and
 * reduced in a fixed order), softmax per head, then each 8-float column of a block's value
 * rows summed in registers, in key order. G is a compile-time constant in `attend`. */
static inline __attribute__((always_inline)) void attend_group(
    const float *q, const void *K, const void *V, const int64_t *table, int64_t block_size,
    int64_t len, int64_t head_dim, float scale, float *scores, float *out, const int G, const int kvt) {
    for (int64_t j0 = 0; j0 < len; j0 += block_size) {
        const int64_t kb = table[j0 / block_size] * block_size * head_dim;
        const int64_t nj = len - j0 < block_size ? len - j0 : block_size;
        for (int64_t j = 0; j < nj; j++) {
            const int64_t k = kb + j * head_dim;
            v8 acc[MAX_GROUP];
            for (int g = 0; g < G; g++)
                acc[g] = (v8){0};
            for (int64_t d = 0; d < head_dim; d += 8) {
                const v8 kd = load8kv(K, k + d, kvt);
                for (int g = 0; g < G; g++)
                    acc[g] += load8(q + g * head_dim + d) * kd;
            }
            for (int g = 0; g < G; g++)
                scores[g * len + j0 + j] = scale * hsum8(acc[g]);
        }
    }
    for (int g = 0; g < G; g++) {
        float *s = scores + g * len;
        softmax_shifted(s, len, max_of(s, len));
    }
    memset(out, 0, sizeof(float) * (size_t)(G * head_dim));
    for (int64_t j0 = 0; j0 < len; j0 += block_size) {
        const int64_t vb = table[j0 / block_size] * block_size * head_dim;
        const int64_t nj = len - j0 < block_size ? len - j0 : block_size;
        for (int64_t d = 0; d < head_dim; d += 8) {
            v8 acc[MAX_GROUP];
            for (int g = 0; g < G; g++)
                acc[g] = load8(out + g * head_dim + d);
            for (int64_t j = 0; j < nj; j++) {
                const v8 vd = load8kv(V, vb + j * head_dim + d, kvt);
                for (int g = 0; g < G; g++)
                    acc[g] += scores[g * len + j0 + j] * vd;
            }
            for (int g = 0; g < G; g++)
                store8(out + g * head_dim + d, acc[g]);
        }
    }
}

/* The same in plain scalar code, for head_dim not a multiple of 8 or groups over MAX_GROUP. */
static void attend_scalar(const float *q, const void *K, const void *V, const int64_t *table,
                          int64_t block_size, int64_t len, int64_t head_dim, float scale, float *scores,
                          float *out, int64_t G, int kvt) {
    for (int64_t j = 0; j < len; j++) {
        const int64_t k = (table[j / block_size] * block_size + j % block_size) * head_dim;
        for (int64_t g = 0; g < G; g++) {
            float s = 0.0f;
            for (int64_t d = 0; d < head_dim; d++)
                s += q[g * head_dim + d] * kv_at(K, k + d, kvt);
            scores[g * len + j] = scale * s;
        }
    }
    for (int64_t g = 0; g < G; g++)
        softmax_shifted(scores + g * len, len, max_of(scores + g * len, len));
    memset(out, 0, sizeof(float) * (size_t)(G * head_dim));
    for (int64_t j = 0; j < len; j++) {
        const int64_t v = (table[j / block_size] * block_size + j % block_size) * head_dim;
        for (int64_t g = 0; g < G; g++)
            for (int64_t d = 0; d < head_dim; d++)
                out[g * head_dim + d] += scores[g * len + j] * kv_at(V, v + d, kvt);
    }
}

#define ATTEND(G, T) attend_group(q, K, V, table, block_size, len, head_dim, scale, scores, out, G, T)
#define ATTEND_T(T)                                                                                             \
    switch (G) {                                                                                                \
    case 1: ATTEND(1, T); return;                                                                               \
    case 2: ATTEND(2, T); return;                                                                               \
    case 3: ATTEND(3, T); return;                                                                               \
    case 4: ATTEND(4, T); return;                                                                               \
    case 5: ATTEND(5, T); return;                                                                               \
    case 6: ATTEND(6, T); return;                                                                               \
    case 7: ATTEND(7, T); return;                                                                               \
    case 8: ATTEND(8, T); return;                                                                               \
    default: break;                                                                                             \
    }

static void attend(const float *q, const void *K, const void *V, const int64_t *table, int64_t block_size,
                   int64_t len, int64_t head_dim, float scale, float *scores, float *out, int64_t G, int kvt) {
    if (head_dim % 8 == 0) {
        if (kvt == KV_F32) {
            ATTEND_T(KV_F32)
        } else if (kvt == KV_F16) {
            ATTEND_T(KV_F16)
        } else {
            ATTEND_T(KV_BF16)
        }
    }
    attend_scalar(q, K, V, table, block_size, len, head_dim, scale, scores, out, G, kvt);
}

/* For each token i (0 <= i < n_tok), each query head:
 *   out[rows[i]] = softmax(scale * q[rows[i]] . K[0:lens[i]]) V[0:lens[i]]
 * over the keys of request reqs[i] (block table tables[reqs[i]]). q rows are q_stride floats
 * apart, each [kv_heads * q_per_kv, head_dim] contiguous; out rows out_stride apart; the
 * cache's elements of type kv_type (0 float32, 1 float16, 2 bfloat16).
 * Returns 0, or -1 if scratch memory could not be allocated (or kv_type is none of those). */
int tr_paged_attention(const float *q, int64_t q_stride, const void *kv, int kv_type, int64_t num_blocks,
                       int64_t block_size, int64_t kv_heads, int64_t q_per_kv, int64_t head_dim,
                       const int64_t *tables, int64_t table_stride, const int64_t *rows,
                       const int64_t *reqs, const int64_t *lens, int64_t n_tok, float scale,
                       float *out, int64_t out_stride, int64_t threads) {
    int64_t max_len = 1;
    for (int64_t i = 0; i < n_tok; i++)
        if (lens[i] > max_len)
            max_len = lens[i];
    const int64_t tasks = n_tok * kv_heads;
    if (threads > tasks)
        threads = tasks;
    if (threads < 1)
        threads = 1;
    if (kv_type < KV_F32 || kv_type > KV_BF16)
        return -1;
    const int64_t per_thread = q_per_kv * max_len;
    float *scores = malloc(sizeof(float) * (size_t)(threads * per_thread));
    if (!scores)
        return -1;
    const int64_t head_size = num_blocks * block_size * head_dim * KV_BYTES[kv_type]; /* bytes */
    const char *kvb = (const char *)kv;
    const int64_t group_size = q_per_kv * head_dim;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t i = task / kv_heads, h = task % kv_heads;
#ifdef _OPENMP
        float *mine = scores + omp_get_thread_num() * per_thread;
#else
        float *mine = scores;
#endif
        attend(q + rows[i] * q_stride + h * group_size, kvb + h * head_size, kvb + (kv_heads + h) * head_size,
               tables + reqs[i] * table_stride, block_size, lens[i], head_dim, scale, mine,
               out + rows[i] * out_stride + h * group_size, q_per_kv, kv_type);
    }
    free(scores);
    return 0;
}
