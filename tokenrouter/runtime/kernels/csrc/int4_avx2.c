/* y = x @ W.T for a 4-bit matrix W on integer dot products: AVX2 (vpmaddubsw), AVX-VNNI
 * (vpdpbusd ymm) or AVX-512 VNNI (vpdpbusd zmm), chosen at compile time from the -march
 * macros (`tr_i4x_isa()` says which one a build holds). Output float32.
 *
 * Weights. W [N, K] is 4-bit codes q in 0..15 with, per output row n and group g of 32
 * inputs, a scale s and a min m: w = s q + m. GGUF's Q4_1 is this form (s = d, m = m), Q4_0
 * is m = -8 d, Q4_K is s = d sc, m = -dmin mn (quant.py's scale/zero: m = zero - 8 scale).
 * s and m are held as float16 (exact for Q4_0/Q4_1, whose files store them so).
 *
 * Activations. Each row of x (float32 or bfloat16) is quantised once per call, per group of
 * 32, to integers Q = round(x / dx), dx = max|x| / L, with the group's sum sx = dx * sum(Q):
 *   - xbits = 8:  L = 127, Q is int8 (llama.cpp's Q8_1 recipe);
 *   - xbits = 16: L = 127 * 254 = 32258, Q = 254 q1 + q2 held as two int8 digits (q1 = round
 *     (Q / 254), q2 = Q - 254 q1, both in -127..127), so the dot products stay u8 x s8 and
 *     cost twice the 8-bit ones; ~15-bit activations, far finer than bfloat16.
 * Then, exactly in integers and in float32 after:
 *
 *     y[r, n] = sum over g of  (s[n,g] * dx[r,g]) * D[r,n,g]  +  m[n,g] * sx[r,g],
 *     D[r,n,g] = sum over the group's 32 inputs i of q[n,i] * Q[r,i]        (an exact int32)
 *
 * (16 bits: D = 254 D1 + D2 from the digits' dot products, |D| <= 32 * 15 * 32258 < 2^24, so
 * float(D) is exact too.) That is the float64 product of the dequantised W and the
 * dequantised x up to float32 rounding (per group: s*dx, and two fused multiply-adds).
 *
 * Packed layout (`tr_i4x_pack`). Output rows go in tiles of 16 (N padded with zero rows to a
 * multiple of 16); a tile is K/32 blocks of 320 bytes, one per group, stored tile after tile:
 *
 *     bytes   0..255: codes, 4 chunks c of 64 bytes for inputs 8c..8c+7 of the group;
 *                     chunk byte 4j + b (j = output 0..15 of the tile, b = 0..3) holds
 *                     input 8c + b in its low nibble and input 8c + 4 + b in its high one;
 *     bytes 256..287: s of the 16 outputs, float16;
 *     bytes 288..319: m of the 16 outputs, float16.
 *
 * 5 bits a weight, as Q4_1 in the file and as torch's int4 packing with its scales and zeros.
 * A 32-byte load of a chunk's half (outputs 8h..8h+7) gives, after `& 0x0F` and `>> 4 & 0x0F`,
 * 8 outputs x 4 consecutive inputs as unsigned bytes, one output per 32-bit lane: exactly the
 * operand of vpdpbusd / vpmaddubsw against the 4 bytes Q[4j..4j+3] broadcast to every lane.
 * Each lane accumulates its own output's dot product: no horizontal sums, and the scales are
 * vectors (16 outputs' s and m side by side). A zmm takes the whole 64-byte chunk.
 *
 * Integer ranges. vpmaddubsw multiplies u8 codes (<= 15) by s8 activations (|q| <= 127) and
 * adds pairs: |pair| <= 2 * 15 * 127 = 3810, far from int16's saturation. The AVX2 path then
 * adds a group's 8 such int16 vectors (|sum| <= 30480 < 32767, no wrap) and widens once with
 * vpmaddwd (against ones, or against 254 for a high digit); VNNI accumulates in int32
 * directly. Either way D is exact, so the three paths give the same bits.
 *
 * Register tiles. Per group, a vector's 8 outputs x 32 inputs (16 on zmm) are unpacked once
 * into 8 registers and used by up to R_MAX = 8 rows, each row's activations broadcast from L1;
 * more rows run in further row tiles over the same weight tile (then in L1/L2). Rows 1..8 of a
 * decode batch therefore read and unpack the weights once.
 *
 * Threads (OpenMP) split the output tiles in contiguous ranges (never K), across all the
 * matrices of a call (`tr_i4x_mm_multi`: q/k/v or gate/up sharing x), after quantising the
 * rows together in the same parallel region; each thread prefetches its next tile.
 *
 * Batch invariance. Each output y[r, n] is computed by the same operations in the same order
 * whatever the number of rows in x, the row tile it lands in, its position in a vector, the
 * thread count and the ISA: its quantised row depends on x[r] alone; D is an exact integer;
 * then per group, in increasing g, t = s*dx (one rounding), acc = fma(float(D), t, acc),
 * acc = fma(m, sx, acc), starting from acc = 0. Nothing can be contracted differently
 * between row counts: every float operation is an explicit fused multiply-add or a multiply
 * whose result only feeds a multiply-add's multiplicand.
 *
 * Entry points (all return 0, or a nonzero code: 1 no memory, 2 not built for this CPU,
 * 3 bad arguments): tr_i4x_isa, tr_i4x_packed_bytes, tr_i4x_scratch_bytes, tr_i4x_pack,
 * tr_i4x_mm, tr_i4x_mm_multi, tr_i4x_quantize + tr_i4x_mm_q (quantise once, multiply later);
 * the prototypes below, and bindings.py (which wraps them), say more.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#include "xquant.h"

#define TILE 16                 /* outputs per packed tile */
#define GROUP 32                /* inputs per group */
#define BLOCK_BYTES 320         /* one tile's group: 256 code bytes + 16 s + 16 m (float16) */
#ifndef R_MAX
#define R_MAX 8 /* rows sharing one unpacking (accumulators beyond the registers stay in L1) */
#endif
#define PARALLEL_MIN (1 << 17)  /* below rows * n * k of this, one thread (fork/join costs more) */

int tr_i4x_isa(void) { return TR_I4X_ISA; }

int64_t tr_i4x_packed_bytes(int64_t n, int64_t k) { return (n + TILE - 1) / TILE * (k / GROUP) * BLOCK_BYTES; }

/* scratch for the quantised activations of `rows` rows of k inputs: two planes of int8 codes
 * [rows, k] (the second used by 16-bit activations: the low digit), then per row and group
 * the float pair (dx, sx) */
static inline int64_t q8_codes_bytes(int64_t rows, int64_t k) { return (rows * k + 63) & ~(int64_t)63; }
int64_t tr_i4x_scratch_bytes(int64_t rows, int64_t k) {
    return 2 * q8_codes_bytes(rows, k) + rows * (k / GROUP) * 2 * (int64_t)sizeof(float);
}

#if TR_I4X_ISA >= 1

/* ------------------------------------------------------------------ packing */

static inline uint16_t to_half(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

/* codes [n, k] uint8 in 0..15 (row stride k), scale and min [n, k/32] float32 (min NULL: 0)
 * -> out (tr_i4x_packed_bytes(n, k) bytes). */
int tr_i4x_pack(const uint8_t *codes, const float *scale, const float *min, int64_t n, int64_t k, uint8_t *out) {
    if (n <= 0 || k <= 0 || k % GROUP)
        return 3;
    const int64_t groups = k / GROUP, tiles = (n + TILE - 1) / TILE;
    for (int64_t t = 0; t < tiles; t++) {
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *blk = out + (t * groups + g) * BLOCK_BYTES;
            uint16_t *sh = (uint16_t *)(blk + 256), *mh = (uint16_t *)(blk + 288);
            for (int j = 0; j < TILE; j++) {
                const int64_t row = t * TILE + j;
                const int live = row < n;
                for (int c = 0; c < 4; c++) {
                    for (int b = 0; b < 4; b++) {
                        uint8_t lo = 0, hi = 0;
                        if (live) {
                            lo = codes[row * k + g * GROUP + 8 * c + b] & 0x0F;
                            hi = codes[row * k + g * GROUP + 8 * c + 4 + b] & 0x0F;
                        }
                        blk[c * 64 + 4 * j + b] = (uint8_t)(lo | hi << 4);
                    }
                }
                sh[j] = live ? to_half(scale[row * groups + g]) : 0;
                mh[j] = live && min ? to_half(min[row * groups + g]) : 0;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ activations */

static inline void store_i8(int8_t *dst, const __m256i qi[4]) {
    /* int32 -> int8 (values already in -127..127): packs interleave 128-bit lanes; a final
     * dword permute restores the order */
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* One row of k inputs -> per group of 32 the integer codes Q = round(x / dx) with
 * dx = max|x| / L, and (dx, sx = dx * sum Q). 8-bit activations (q2 NULL): L = 127, Q is the
 * int8 code q1. 16-bit activations: L = 127 * 254 = 32258, Q = 254 q1 + q2 split into two int8
 * digits (q1 = round(Q / 254), q2 = Q - 254 q1, both in -127..127), so that the dot products
 * stay u8 x s8 and the product D = 254 D1 + D2 is exact. */
static void quantize_row(const void *x, int bf16, int64_t k, int8_t *q1, int8_t *q2, float *dxsx) {
    const float levels = q2 ? (float)XLEVELS16 : 127.0f;
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m256i qi[4];
        const float dx = quant_group(x, bf16, g * GROUP, levels, qi);
        dxsx[2 * g] = dx;
        dxsx[2 * g + 1] = dx * (float)hsum_i32(qi); /* |sum| <= 32 * 32258: exact in float */
        if (!q2) {
            store_i8(q1 + g * GROUP, qi);
            continue;
        }
        __m256i hi[4], lo[4];
        const __m256 inv254 = _mm256_set1_ps(1.0f / 254.0f);
        for (int i = 0; i < 4; i++) {
            /* Q / 254 is never within float error of a half unless exactly a half (Q = 254 k
             * + 127), where either neighbour leaves |q2| = 127 */
            hi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(qi[i]), inv254));
            lo[i] = _mm256_sub_epi32(qi[i], _mm256_sub_epi32(_mm256_slli_epi32(hi[i], 8), _mm256_slli_epi32(hi[i], 1)));
        }
        store_i8(q1 + g * GROUP, hi);
        store_i8(q2 + g * GROUP, lo);
    }
}

/* ------------------------------------------------------------------ the product */

#if TR_I4X_ISA == 3 && defined(TR_I4X_EMULATE_512)
/* tests only: the AVX-512 path's 16-lane vectors as pairs of ymm (xquant.h) */
static inline vi e_load(const void *p) {
    vi r = {_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)((const char *)p + 32))};
    return r;
}
static inline vi e_and(vi x, vi y) { vi r = {_mm256_and_si256(x.a, y.a), _mm256_and_si256(x.b, y.b)}; return r; }
static inline vi e_srl4(vi x) { vi r = {_mm256_srli_epi16(x.a, 4), _mm256_srli_epi16(x.b, 4)}; return r; }
static inline vi e_set1_8(char c) { vi r = {_mm256_set1_epi8(c), _mm256_set1_epi8(c)}; return r; }
static inline __m256i e_dp(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
static inline vi e_dot(vi acc, vi w, vi x) { vi r = {e_dp(acc.a, w.a, x.a), e_dp(acc.b, w.b, x.b)}; return r; }
static inline __m256i e_comb(__m256i d1, __m256i d2) {
    return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(d1, 8), _mm256_slli_epi32(d1, 1)), d2);
}
static inline vi e_combine(vi d1, vi d2) { vi r = {e_comb(d1.a, d2.a), e_comb(d1.b, d2.b)}; return r; }
#define VCOMBINE e_combine
#define VLOAD(p) e_load(p)
#define VAND e_and
#define VSRL16(x, n) e_srl4(x)
#define VSET1_8 e_set1_8
#define VDOT e_dot
#define VFINISH(acc) (acc)
#elif TR_I4X_ISA == 3
/* AVX-512 VNNI: one zmm holds a whole tile's 16 outputs */
#define VLOAD(p) _mm512_loadu_si512((const void *)(p))
#define VAND _mm512_and_si512
#define VSRL16 _mm512_srli_epi16
#define VSET1_8 _mm512_set1_epi8
#define VDOT(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#define VFINISH(acc) (acc)
/* 16-bit activations: D = 254 D1 + D2 (int32, exact) */
#define VCOMBINE(d1, d2) \
    _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(d1, 8), _mm512_slli_epi32(d1, 1)), d2)
#else
#define VLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define VAND _mm256_and_si256
#define VSRL16 _mm256_srli_epi16
#define VSET1_8 _mm256_set1_epi8
#if TR_I4X_ISA == 2
#ifdef __AVXVNNI__
#define VDOT(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#else /* TR_I4X_EMULATE_VNNI: the same int32 sums on AVX2 (no saturation at these ranges) */
#define VDOT(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#endif
#define VFINISH(acc) (acc)
#define VCOMBINE(d1, d2) \
    _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(d1, 8), _mm256_slli_epi32(d1, 1)), d2)
#else /* AVX2: int16 sums of a group's 8 pair-products (|sum| <= 30480), widened once */
#define VDOT(acc, w, x) _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x))
#define VFINISH(acc) _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
/* 16-bit activations: D = 254 D1 + D2, widened with the digit weights (int32, exact) */
#define VCOMBINE(d1, d2) \
    _mm256_add_epi32(_mm256_madd_epi16(d1, _mm256_set1_epi16(254)), _mm256_madd_epi16(d2, _mm256_set1_epi16(1)))
#endif
#endif
#define HALVES (TILE / LANES) /* vectors per tile: 2 (ymm) or 1 (zmm) */

/* One tile (16 outputs) for rows r0 .. r0+R-1 (R and X2 compile-time constants after
 * inlining), one vector of LANES outputs at a time (2 passes on ymm, 1 on zmm; a second pass
 * finds the tile's blocks in L1). Per group, the vector's 32 inputs x LANES codes are
 * unpacked once into 8 registers w[j] (w[j] holds inputs 4j..4j+3 of each output: chunk
 * j / 2's low nibbles for even j, high for odd), then each row runs its 8 dot products
 * against its broadcast activations, widens, scales and accumulates: registers 8 w + a dot
 * (two with X2) + a broadcast + R accumulators + scales. */
#ifndef R_MAX16 /* rows per tile with 16-bit activations */
#define R_MAX16 R_MAX
#endif

static inline __attribute__((always_inline)) void
tile_rows(const int8_t *xq, const int8_t *xq2, const float *xs, int64_t k, int64_t r0, const int R, const int X2,
          const uint8_t *wt, float *out, int64_t out_stride, int64_t col, int64_t ncols, const uint8_t *pf) {
    const int64_t groups = k / GROUP;
    for (int h = 0; h < HALVES; h++) {
        vf acc[8]; /* R <= 8 */
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r] = VFZERO();
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *blk = wt + g * BLOCK_BYTES;
            if (pf && h == 0) { /* the next tile's block g, while this one computes */
                const char *p = (const char *)(pf + g * BLOCK_BYTES);
                _mm_prefetch(p, _MM_HINT_T0);
                _mm_prefetch(p + 64, _MM_HINT_T0);
                _mm_prefetch(p + 128, _MM_HINT_T0);
                _mm_prefetch(p + 192, _MM_HINT_T0);
                _mm_prefetch(p + 256, _MM_HINT_T0);
            }
            const vi mask = VSET1_8(0x0F);
            vi w[8];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const vi v = VLOAD(blk + c * 64 + h * (LANES * 4));
                w[2 * c] = VAND(v, mask);
                w[2 * c + 1] = VAND(VSRL16(v, 4), mask);
            }
            const vf s = VHALF(blk + 256 + h * (LANES * 2)), m = VHALF(blk + 288 + h * (LANES * 2));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const int64_t off = (r0 + r) * k + g * GROUP;
                vi dot = VZERO(), dot2 = VZERO();
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    dot = VDOT(dot, w[j], VBCAST32(load4(xq + off + 4 * j)));
                    if (X2)
                        dot2 = VDOT(dot2, w[j], VBCAST32(load4(xq2 + off + 4 * j)));
                }
                const float *d = xs + ((r0 + r) * groups + g) * 2;
                /* D: an exact int32 (|D| <= 32 * 15 * 32258 < 2^24, so exact in float too) */
                const vf dd = VCVT(X2 ? VCOMBINE(dot, dot2) : VFINISH(dot));
                const vf t = VMUL(s, VF1(d[0]));
                acc[r] = VFMA(dd, t, acc[r]);
                acc[r] = VFMA(m, VF1(d[1]), acc[r]);
            }
        }
        store_rows(acc, R, out, out_stride, r0, col + h * LANES, ncols);
    }
}

typedef void (*tile_fn)(const int8_t *, const int8_t *, const float *, int64_t, int64_t, const uint8_t *, float *,
                        int64_t, int64_t, int64_t, const uint8_t *);
#define TILE_R(n, x2)                                                                                          \
    static void tile_rows##n##_##x2(const int8_t *xq, const int8_t *xq2, const float *xs, int64_t k,          \
                                    int64_t r0, const uint8_t *wt, float *out, int64_t out_stride,            \
                                    int64_t col, int64_t ncols, const uint8_t *pf) {                          \
        tile_rows(xq, xq2, xs, k, r0, n, x2, wt, out, out_stride, col, ncols, pf);                            \
    }
TILE_R(1, 0) TILE_R(2, 0) TILE_R(3, 0) TILE_R(4, 0) TILE_R(5, 0) TILE_R(6, 0) TILE_R(7, 0) TILE_R(8, 0)
TILE_R(1, 1) TILE_R(2, 1) TILE_R(3, 1) TILE_R(4, 1) TILE_R(5, 1) TILE_R(6, 1) TILE_R(7, 1) TILE_R(8, 1)
static const tile_fn TILES[2][9] = {
    {0, tile_rows1_0, tile_rows2_0, tile_rows3_0, tile_rows4_0, tile_rows5_0, tile_rows6_0, tile_rows7_0, tile_rows8_0},
    {0, tile_rows1_1, tile_rows2_1, tile_rows3_1, tile_rows4_1, tile_rows5_1, tile_rows6_1, tile_rows7_1, tile_rows8_1}};

typedef struct { /* the quantised rows in a scratch buffer (tr_i4x_scratch_bytes) */
    int8_t *q1, *q2; /* q2: the low digits, NULL with 8-bit activations */
    float *xs;
} qrows;

static qrows qrows_at(void *scratch, int64_t rows, int64_t k, int xbits) {
    qrows q;
    q.q1 = (int8_t *)scratch;
    q.q2 = xbits == 16 ? (int8_t *)scratch + q8_codes_bytes(rows, k) : NULL;
    q.xs = (float *)((uint8_t *)scratch + 2 * q8_codes_bytes(rows, k));
    return q;
}

/* tile t of one matrix for all rows, in row tiles of R_MAX (R_MAX16); `next` is the tile
 * this thread runs after it (NULL: none), whose blocks are prefetched while the first row
 * tile computes */
static void one_tile(qrows q, int64_t rows, int64_t k, const uint8_t *w, int64_t n, int64_t t, float *out,
                     int64_t out_stride, const uint8_t *next) {
    const uint8_t *wt = w + t * (k / GROUP) * BLOCK_BYTES;
    const int x2 = q.q2 != NULL, rmax = x2 ? R_MAX16 : R_MAX;
    for (int64_t r0 = 0; r0 < rows; r0 += rmax) {
        const int64_t nr = rows - r0 < rmax ? rows - r0 : rmax;
        TILES[x2][nr](q.q1, q.q2, q.xs, k, r0, wt, out, out_stride, t * TILE, n, r0 == 0 ? next : NULL);
    }
}

static void quantize_rows(const void *x, int x_bf16, int64_t x_stride, int64_t r_begin, int64_t r_end, int64_t k,
                          qrows q) {
    for (int64_t r = r_begin; r < r_end; r++)
        quantize_row(x_bf16 ? (const void *)((const uint16_t *)x + r * x_stride)
                            : (const void *)((const float *)x + r * x_stride),
                     x_bf16, k, q.q1 + r * k, q.q2 ? q.q2 + r * k : NULL, q.xs + r * (k / GROUP) * 2);
}

static int bad(int64_t rows, int64_t k, int xbits) {
    return rows < 0 || k <= 0 || k % GROUP || (xbits != 8 && xbits != 16);
}

/* The products of `nmat` matrices w[i] ([n[i], k], packed) with the quantised rows, into
 * out[i] (row stride out_stride[i]); when x is given it is quantised first (into scratch),
 * in the same parallel region. Threads take contiguous ranges of the matrices' tiles. */
static int run(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, void *scratch,
               int nmat, const uint8_t *const *w, const int64_t *n, float *const *out, const int64_t *out_stride,
               int threads) {
    if (bad(rows, k, xbits) || nmat <= 0 || nmat > 64)
        return 3;
    if (rows == 0)
        return 0;
    const qrows q = qrows_at(scratch, rows, k, xbits);
    int64_t tiles = 0, work = 0;
    int64_t first[65]; /* first tile of each matrix */
    for (int i = 0; i < nmat; i++) {
        if (n[i] <= 0 || !w[i] || !out[i])
            return 3;
        first[i] = tiles;
        tiles += (n[i] + TILE - 1) / TILE;
        work += n[i];
    }
    first[nmat] = tiles;
    work *= rows * k * (xbits == 16 ? 2 : 1);
#ifdef _OPENMP
    if (threads <= 0)
        threads = omp_get_max_threads();
    const int nt = work >= PARALLEL_MIN && threads > 1 ? (tiles < threads ? (int)tiles : threads) : 1;
#pragma omp parallel num_threads(nt)
#endif
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num(), all = omp_get_num_threads();
#else
        const int me = 0, all = 1;
        (void)threads;
#endif
        if (x) {
            quantize_rows(x, x_bf16, x_stride, rows * me / all, rows * (me + 1) / all, k, q);
#ifdef _OPENMP
#pragma omp barrier
#endif
        }
        const int64_t t0 = tiles * me / all, t1 = tiles * (me + 1) / all;
        int i = 0;
        for (int64_t t = t0; t < t1; t++) {
            while (t >= first[i + 1])
                i++;
            const uint8_t *next = NULL;
            if (t + 1 < t1) {
                const int j = t + 1 < first[i + 1] ? i : i + 1;
                next = w[j] + (t + 1 - first[j]) * (k / GROUP) * BLOCK_BYTES;
            }
            one_tile(q, rows, k, w[i], n[i], t - first[i], out[i], out_stride[i], next);
        }
    }
    return 0;
}

/* x [rows, k] (float32, or bfloat16 when x_bf16; row stride x_stride elements) -> the rows
 * quantised to xbits (8 or 16) per group of 32, in scratch (tr_i4x_scratch_bytes(rows, k)),
 * for tr_i4x_mm_q (e.g. a norm that quantises its output once for q/k/v). */
int tr_i4x_quantize(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, void *scratch) {
    if (bad(rows, k, xbits) || !scratch)
        return 3;
    quantize_rows(x, x_bf16, x_stride, 0, rows, k, qrows_at(scratch, rows, k, xbits));
    return 0;
}

/* products of already quantised rows (tr_i4x_quantize, same rows, k and xbits) with nmat
 * packed matrices */
int tr_i4x_mm_q(const void *scratch, int64_t rows, int64_t k, int xbits, int nmat, const uint8_t *const *w,
                const int64_t *n, float *const *out, const int64_t *out_stride, int threads) {
    if (!scratch)
        return 3;
    return run(NULL, 0, 0, rows, k, xbits, (void *)scratch, nmat, w, n, out, out_stride, threads);
}

/* x [rows, k] @ W_i.T -> out[i] [rows, n[i]] float32 for nmat (<= 64) matrices sharing x
 * (q/k/v, gate/up): x is quantised once, to xbits (8: int8 per group of 32, llama.cpp's Q8_1;
 * 16: two int8 digits, ~15 bits). scratch: tr_i4x_scratch_bytes(rows, k) bytes, or NULL to
 * allocate it here. */
int tr_i4x_mm_multi(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, int nmat,
                    const uint8_t *const *w, const int64_t *n, float *const *out, const int64_t *out_stride,
                    void *scratch, int threads) {
    if (bad(rows, k, xbits))
        return 3;
    void *mine = NULL;
    if (!scratch) {
        scratch = mine = malloc((size_t)tr_i4x_scratch_bytes(rows > 0 ? rows : 1, k));
        if (!mine)
            return 1;
    }
    const int rc = run(x, x_bf16, x_stride, rows, k, xbits, scratch, nmat, w, n, out, out_stride, threads);
    free(mine);
    return rc;
}

/* x [rows, k] @ W.T -> out [rows, n] float32 (row stride out_stride) */
int tr_i4x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads) {
    return tr_i4x_mm_multi(x, x_bf16, x_stride, rows, k, xbits, 1, &w, &n, &out, &out_stride, scratch, threads);
}

#else /* no AVX2 + FMA + F16C in this build: every entry point says so (2) */

int tr_i4x_pack(const uint8_t *codes, const float *scale, const float *min, int64_t n, int64_t k, uint8_t *out) {
    (void)codes; (void)scale; (void)min; (void)n; (void)k; (void)out;
    return 2;
}
int tr_i4x_quantize(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, void *scratch) {
    (void)x; (void)x_bf16; (void)x_stride; (void)rows; (void)k; (void)xbits; (void)scratch;
    return 2;
}
int tr_i4x_mm_q(const void *scratch, int64_t rows, int64_t k, int xbits, int nmat, const uint8_t *const *w,
                const int64_t *n, float *const *out, const int64_t *out_stride, int threads) {
    (void)scratch; (void)rows; (void)k; (void)xbits; (void)nmat; (void)w; (void)n; (void)out; (void)out_stride;
    (void)threads;
    return 2;
}
int tr_i4x_mm_multi(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, int nmat,
                    const uint8_t *const *w, const int64_t *n, float *const *out, const int64_t *out_stride,
                    void *scratch, int threads) {
    (void)x; (void)x_bf16; (void)x_stride; (void)rows; (void)k; (void)xbits; (void)nmat; (void)w; (void)n;
    (void)out; (void)out_stride; (void)scratch; (void)threads;
    return 2;
}
int tr_i4x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads) {
    (void)x; (void)x_bf16; (void)x_stride; (void)rows; (void)k; (void)xbits; (void)w; (void)n; (void)out;
    (void)out_stride; (void)scratch; (void)threads;
    return 2;
}

#endif
