/* Rows of a GGUF matrix, dequantised from the file's own blocks (`blocks.BlockRows`): the
 * embedding lookup reads the rows of the tokens it embeds, and the LM head's rescoring the rows
 * of its best candidates (head_rescore.c), so neither holds a float copy of the matrix.
 *
 * A row of K weights is K / B blocks of the type's layout (B = 32, or 256 for the K-quants),
 * stored one after the other; rows follow each other every `row_bytes` bytes. The values are
 * ggml's, computed in float32 in the order the `gguf` package's dequantisers compute them (no
 * fused multiply-adds: this file turns contraction off), so they equal that package's bit for
 * bit (tests/runtime/engine/test_gguf_rows.py):
 *
 *   F32, F16, BF16   the value
 *   Q4_0  (18 B)     d (q - 8),            q 4 bits
 *   Q4_1  (20 B)     d q + m,              q 4 bits
 *   Q5_0  (22 B)     d (q - 16),           q 5 bits (4 in qs, the 5th in qh)
 *   Q5_1  (24 B)     d q + m,              q 5 bits
 *   Q8_0  (34 B)     d q,                  q int8
 *   Q4_K  (144 B)    (d sc_j) q - (dmin m_j), q 4 bits, 6-bit sc_j and m_j per 32
 *   Q5_K  (176 B)    (d sc_j) q - (dmin m_j), q 5 bits
 *   Q6_K  (210 B)    (d sc_j) (q - 32),    q 6 bits, int8 sc_j per 16
 *
 * with d, m, dmin float16. Entry points: tr_gguf_supported, tr_gguf_rows, and
 * tr_gguf_dequant_row (kernels.h) for the other kernels. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14, T_BF16 = 30 };

static float half(const uint8_t *p) { /* IEEE float16, little endian, to float32 (exact) */
    const uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | exp << 23 | (man & 0x3FF) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16(const uint8_t *p) {
    const uint32_t bits = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Bytes per block and weights per block of a supported type, else 0. */
static int block_shape(int type, int *weights) {
    switch (type) {
    case T_F32: *weights = 1; return 4;
    case T_F16: case T_BF16: *weights = 1; return 2;
    case T_Q4_0: *weights = 32; return 18;
    case T_Q4_1: *weights = 32; return 20;
    case T_Q5_0: *weights = 32; return 22;
    case T_Q5_1: *weights = 32; return 24;
    case T_Q8_0: *weights = 32; return 34;
    case T_Q4_K: *weights = 256; return 144;
    case T_Q5_K: *weights = 256; return 176;
    case T_Q6_K: *weights = 256; return 210;
    default: *weights = 0; return 0;
    }
}

int tr_gguf_supported(int type) {
    int w;
    return block_shape(type, &w) > 0;
}

static void q5_block(const uint8_t *b, int has_min, float *y) {
    const float d = half(b), m = has_min ? half(b + 2) : 0.0f;
    const uint8_t *qhp = b + (has_min ? 4 : 2), *qs = qhp + 4;
    const uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 0x0F) | ((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
        if (has_min) {
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        } else {
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

static void k4_block(const uint8_t *b, int five, float *y) {
    const float d = half(b), dmin = half(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = five ? b + 48 : b + 16;
    for (int j = 0; j < 8; j++) { /* sub-block j: 32 weights, low nibbles of even j's bytes, high of odd */
        int sc, mn;
        scale_min_k4(j, scales, &sc, &mn);
        const float dl = d * (float)sc, ml = dmin * (float)mn;
        const uint8_t *q = ql + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            int v = (j & 1) ? q[l] >> 4 : q[l] & 0x0F;
            if (five)
                v |= ((qh[l] >> j) & 1) << 4;
            const float t = dl * (float)v;
            y[32 * j + l] = t - ml;
        }
    }
}

static void q6k_block(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = half(b + 208);
    for (int n = 0; n < 2; n++) { /* halves of 128 weights */
        for (int l = 0; l < 32; l++) {
            const int h = qh[32 * n + l];
            const int q[4] = {(ql[64 * n + l] & 0x0F) | (h & 3) << 4, (ql[64 * n + l + 32] & 0x0F) | ((h >> 2) & 3) << 4,
                              (ql[64 * n + l] >> 4) | ((h >> 4) & 3) << 4, (ql[64 * n + l + 32] >> 4) | ((h >> 6) & 3) << 4};
            for (int s = 0; s < 4; s++) {
                const int i = 128 * n + 32 * s + l; /* weight index in the block; scale per 16 */
                y[i] = (d * (float)sc[i / 16]) * (float)(q[s] - 32);
            }
        }
    }
}

/* One row of k weights (k a multiple of the type's block) -> y. Returns 0, or 3 for an
 * unsupported type or a k that is no multiple of its block. */
int tr_gguf_dequant_row(int type, const uint8_t *row, int64_t k, float *y) {
    int per;
    const int bytes = block_shape(type, &per);
    if (!bytes || k % per)
        return 3;
    for (int64_t b = 0; b < k / per; b++) {
        const uint8_t *p = row + b * bytes;
        float *o = y + b * per;
        switch (type) {
        case T_F32: memcpy(o, p, 4); break;
        case T_F16: o[0] = half(p); break;
        case T_BF16: o[0] = bf16(p); break;
        case T_Q4_0: case T_Q4_1: {
            const float d = half(p), m = type == T_Q4_1 ? half(p + 2) : 0.0f;
            const uint8_t *qs = p + (type == T_Q4_1 ? 4 : 2);
            for (int j = 0; j < 16; j++) {
                if (type == T_Q4_1) {
                    o[j] = d * (float)(qs[j] & 0x0F) + m;
                    o[j + 16] = d * (float)(qs[j] >> 4) + m;
                } else {
                    o[j] = d * (float)((qs[j] & 0x0F) - 8);
                    o[j + 16] = d * (float)((qs[j] >> 4) - 8);
                }
            }
            break;
        }
        case T_Q5_0: q5_block(p, 0, o); break;
        case T_Q5_1: q5_block(p, 1, o); break;
        case T_Q8_0: {
            const float d = half(p);
            for (int j = 0; j < 32; j++)
                o[j] = (float)(int8_t)p[2 + j] * d;
            break;
        }
        case T_Q4_K: k4_block(p, 0, o); break;
        case T_Q5_K: k4_block(p, 1, o); break;
        case T_Q6_K: q6k_block(p, o); break;
        }
    }
    return 0;
}

/* Rows ids[0..n) of a [?, k] matrix of `type` blocks (row r at data + r * row_bytes) ->
 * out [n, k] float32 (row stride out_stride). The ids are the caller's to keep in range.
 * Returns 0, or 3 (see tr_gguf_dequant_row). */
int tr_gguf_rows(int type, const uint8_t *data, int64_t row_bytes, const int64_t *ids, int64_t n, int64_t k,
                 float *out, int64_t out_stride, int threads) {
    int per;
    if (!block_shape(type, &per) || k % per)
        return 3;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n * k >= (1 << 16))
#endif
    for (int64_t i = 0; i < n; i++)
        tr_gguf_dequant_row(type, data + ids[i] * row_bytes, k, out + i * out_stride);
    (void)threads;
    return 0;
}
