/* y = x @ W.T for a matrix of 8-bit codes on integer dot products: AVX2 (vpmaddwd), AVX-VNNI
 * (vpdpwssd ymm) or AVX-512 VNNI (vpdpwssd zmm), chosen at compile time as in int4_avx2.c
 * (xquant.h: `tr_i4x_isa()` says which one a build holds). Output float32.
 *
 * Weights. W [N, K] is signed 8-bit codes c with, per output row n and group g of G inputs
 * (G = 32 or 16), a scale s: w = s c. GGUF's symmetric types are this form exactly
 * (`blocks.BlockRows.codes`): Q8_0 (c = q, G 32, s = d), Q5_0 (c = q - 16, G 32, s = d),
 * Q6_K (c = q - 32, G 16, s = d sc, exact in float32). The scales are held as float16 where
 * every one of the matrix's is a float16 (Q8_0's and Q5_0's d), else as float32.
 *
 * Activations. Each row of x (float32 or bfloat16) is quantised once per call, per group of
 * 32, to integers Q = round(x / dx), dx = max|x| / L, exactly as the int4 kernel does
 * (xquant.h): L = 32258 (xbits 16, ~15 bits) or 127 (xbits 8), held as int16. Then
 *
 *     y[r, n] = sum over groups of (s[n, g] * dx[r, g']) * E[r, n, g],
 *     E = sum over the group's inputs i of c[n, i] * Q[r, i]       (an exact int32)
 *
 * (g' the activation group of 32 holding weight group g). The dot products take int16 pairs:
 * the codes sign-extended to int16 (vpmovsxbw), two inputs a 32-bit lane, one output per
 * lane, against the row's two Q broadcast to every lane: vpmaddwd + vpaddd on AVX2, vpdpwssd
 * with VNNI. No saturation anywhere: |c Q| <= 128 * 32258 < 2^22 and a group's sum < 2^28, so
 * E is the same integer on every path and the three paths give the same bits. float(E) is
 * exact for |E| < 2^24 (Q5_0, Q6_K: |c| <= 32), else rounded once.
 *
 * Packed layout (`tr_i8x_pack`): a 64-byte header (int64 n, k, group, scale bytes), then
 * tiles of 16 output rows (N padded with zero rows), each K / 32 blocks, one per group of
 * 32 inputs:
 *
 *     bytes 0..511: 16 chunks p of 32 bytes for inputs 2p, 2p + 1; chunk byte 2j + b holds
 *                   the code of output j (0..15) for input 2p + b;
 *     then the scales: G = 32: s of the 16 outputs; G = 16: s of the 16 outputs for
 *                   inputs 0..15, then for inputs 16..31; float16 or float32.
 *
 * 8.5 bits a weight with float16 scales of group 32 (as Q8_0 in the file), 10 with float32
 * scales of group 16 (Q6_K: 6.6 in the file). A load of 16 bytes of a chunk (outputs 8h ..
 * 8h + 7) sign-extended to int16 is exactly the operand of vpmaddwd / vpdpwssd against a row's
 * 4 bytes Q[2p], Q[2p + 1] broadcast to every lane; a zmm takes the whole chunk.
 *
 * Register tiles, threads and batch invariance as int4_avx2.c: per half-group, the 8 chunks'
 * codes of a vector of outputs are widened once into 8 registers and used by up to R_MAX
 * rows; threads split the output tiles in contiguous ranges after quantising the rows
 * together; each output y[r, n] is computed by the same operations in the same order
 * whatever the rows, the thread count or the ISA: per group, in increasing g, E exact,
 * t = s * dx (one rounding), acc = fma(float(E), t, acc) from acc = 0 (for G = 16: the
 * first 16 inputs' term, then the second's).
 *
 * Entry points (0, or 1 no memory, 2 not built for this CPU, 3 bad arguments):
 * tr_i8x_packed_bytes, tr_i8x_scratch_bytes, tr_i8x_pack, tr_i8x_mm (kernels.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#include "xquant.h"

#define TILE 16
#define GROUP 32
#define CODE_BYTES 512 /* one tile's group of codes */
#define HEADER 64
#ifndef R_MAX
#define R_MAX 8
#endif
#define PARALLEL_MIN (1 << 17) /* below rows * n * k of this, one thread (fork/join costs more) */

static int64_t block_bytes(int64_t group, int64_t sbytes) { return CODE_BYTES + TILE * (GROUP / group) * sbytes; }

static int bad_format(int64_t n, int64_t k, int64_t group, int64_t sbytes) {
    return n <= 0 || k <= 0 || k % GROUP || (group != 16 && group != 32) || (sbytes != 2 && sbytes != 4);
}

int64_t tr_i8x_packed_bytes(int64_t n, int64_t k, int64_t group, int64_t sbytes) {
    if (bad_format(n, k, group, sbytes))
        return -1;
    return HEADER + (n + TILE - 1) / TILE * (k / GROUP) * block_bytes(group, sbytes);
}

/* the quantised activations of `rows` rows of k inputs: int16 codes [rows, k], then dx per
 * row and group of 32 (fits in tr_i4x_scratch_bytes(rows, k), which the decode stack holds) */
static inline int64_t q16_bytes(int64_t rows, int64_t k) { return (rows * k * 2 + 63) & ~(int64_t)63; }
int64_t tr_i8x_scratch_bytes(int64_t rows, int64_t k) { return q16_bytes(rows, k) + rows * (k / GROUP) * 4; }

#if TR_I4X_ISA >= 1

/* codes [n, k] int8 (row stride k), scales [n, k / group] float32 -> out
 * (tr_i8x_packed_bytes(n, k, group, sbytes) bytes); sbytes 2 holds the scales as float16
 * (the caller's to check they are float16 values: they are rounded to nearest otherwise). */
int tr_i8x_pack(const int8_t *codes, const float *scales, int64_t n, int64_t k, int64_t group, int64_t sbytes,
                uint8_t *out) {
    if (bad_format(n, k, group, sbytes))
        return 3;
    const int64_t groups = k / GROUP, tiles = (n + TILE - 1) / TILE, bb = block_bytes(group, sbytes);
    const int64_t head[4] = {n, k, group, sbytes};
    memset(out, 0, HEADER);
    memcpy(out, head, sizeof head);
    for (int64_t t = 0; t < tiles; t++) {
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *blk = out + HEADER + (t * groups + g) * bb;
            for (int j = 0; j < TILE; j++) {
                const int64_t row = t * TILE + j;
                const int live = row < n;
                for (int i = 0; i < GROUP; i++) /* chunk i / 2, byte 2 j + i % 2 */
                    blk[(i / 2) * 32 + 2 * j + i % 2] = live ? (uint8_t)codes[row * k + g * GROUP + i] : 0;
                for (int64_t h = 0; h < GROUP / group; h++) {
                    const float s = live ? scales[row * (k / group) + g * (GROUP / group) + h] : 0.0f;
                    uint8_t *at = blk + CODE_BYTES + (h * TILE + j) * sbytes;
                    if (sbytes == 2) {
                        const uint16_t v = (uint16_t)_cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT);
                        memcpy(at, &v, 2);
                    } else {
                        memcpy(at, &s, 4);
                    }
                }
            }
        }
    }
    return 0;
}

/* one row of k inputs -> int16 Q per input and dx per group of 32 */
static void quantize_row16(const void *x, int bf16, int64_t k, float levels, int16_t *q, float *dx) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m256i qi[4];
        dx[g] = quant_group(x, bf16, g * GROUP, levels, qi);
        const __m256i a = _mm256_packs_epi32(qi[0], qi[1]), b = _mm256_packs_epi32(qi[2], qi[3]);
        /* packs interleave 128-bit lanes: a = 0-3 8-11 4-7 12-15; a 64-bit permute restores it */
        _mm256_storeu_si256((__m256i *)(q + g * GROUP), _mm256_permute4x64_epi64(a, 0xD8));
        _mm256_storeu_si256((__m256i *)(q + g * GROUP + 16), _mm256_permute4x64_epi64(b, 0xD8));
    }
}

/* ------------------------------------------------------------------ the product */

#if TR_I4X_ISA == 3 && defined(TR_I4X_EMULATE_512)
/* tests only: 16 lanes as two ymm (xquant.h), vpdpwssd as vpmaddwd + vpaddd */
static inline vi e_wload(const void *p) {
    vi r = {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((const char *)p + 16)))};
    return r;
}
static inline vi e_wdot(vi acc, vi w, vi x) {
    vi r = {_mm256_add_epi32(acc.a, _mm256_madd_epi16(w.a, x.a)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(w.b, x.b))};
    return r;
}
static inline vi e_add(vi x, vi y) { vi r = {_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)}; return r; }
#define WLOAD e_wload
#define WDOT e_wdot
#define VADD32 e_add
#elif TR_I4X_ISA == 3
#define WLOAD(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define WDOT(acc, w, x) _mm512_dpwssd_epi32(acc, w, x)
#define VADD32 _mm512_add_epi32
#else
#define WLOAD(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#if TR_I4X_ISA == 2 && defined(__AVXVNNI__)
#define WDOT(acc, w, x) _mm256_dpwssd_avx_epi32(acc, w, x)
#else /* AVX2, or AVX-VNNI emulated: the same int32 sums */
#define WDOT(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
#endif
#define VADD32 _mm256_add_epi32
#endif
#define HALVES (TILE / LANES)

/* One tile (16 outputs) for rows r0 .. r0+R-1 (R, G16 and F32S compile-time constants after
 * inlining: weight group 16, float32 scales), one vector of LANES outputs at a time. Per
 * half-group (16 inputs), the vector's 8 chunks are widened once into w[8], then each row
 * runs its 8 dot products against its broadcast pairs of activations. */
static inline __attribute__((always_inline)) void
tile_rows(const int16_t *xq, const float *xs, int64_t k, int64_t r0, const int R, const int G16, const int F32S,
          const uint8_t *wt, float *out, int64_t out_stride, int64_t col, int64_t ncols, const uint8_t *pf) {
    const int64_t groups = k / GROUP, bb = block_bytes(G16 ? 16 : 32, F32S ? 4 : 2);
    for (int h = 0; h < HALVES; h++) {
        vf acc[8]; /* R <= 8 */
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r] = VFZERO();
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *blk = wt + g * bb;
            if (pf && h == 0) { /* the next tile's block g, while this one computes */
                const char *p = (const char *)(pf + g * bb);
                for (int64_t c = 0; c < bb; c += 64)
                    _mm_prefetch(p + c, _MM_HINT_T0);
            }
            const uint8_t *sp = blk + CODE_BYTES + h * LANES * (F32S ? 4 : 2);
            vi e[8]; /* R <= 8: a group's E per row (G = 32) */
#pragma GCC unroll 2
            for (int q = 0; q < 2; q++) { /* inputs 16 q .. 16 q + 15 */
                vi w[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    w[i] = WLOAD(blk + (8 * q + i) * 32 + h * LANES * 2);
                vf s = VFZERO();
                if (G16)
                    s = F32S ? VLOADF(sp + q * TILE * 4) : VHALF(sp + q * TILE * 2);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const int16_t *xr = xq + (r0 + r) * k + g * GROUP + 16 * q;
                    /* four chains (the sums are exact, so any order gives the same E) */
                    vi d = WDOT(VZERO(), w[0], VBCAST32(load4(xr))), d1 = WDOT(VZERO(), w[1], VBCAST32(load4(xr + 2)));
                    vi d2 = WDOT(VZERO(), w[2], VBCAST32(load4(xr + 4))), d3 = WDOT(VZERO(), w[3], VBCAST32(load4(xr + 6)));
                    d = WDOT(d, w[4], VBCAST32(load4(xr + 8)));
                    d1 = WDOT(d1, w[5], VBCAST32(load4(xr + 10)));
                    d2 = WDOT(d2, w[6], VBCAST32(load4(xr + 12)));
                    d3 = WDOT(d3, w[7], VBCAST32(load4(xr + 14)));
                    d = VADD32(VADD32(d, d1), VADD32(d2, d3));
                    if (G16)
                        acc[r] = VFMA(VCVT(d), VMUL(s, VF1(xs[(r0 + r) * groups + g])), acc[r]);
                    else
                        e[r] = q ? VADD32(e[r], d) : d;
                }
            }
            if (!G16) {
                const vf s = F32S ? VLOADF(sp) : VHALF(sp);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r] = VFMA(VCVT(e[r]), VMUL(s, VF1(xs[(r0 + r) * groups + g])), acc[r]);
            }
        }
        store_rows(acc, R, out, out_stride, r0, col + h * LANES, ncols);
    }
}

typedef void (*tile_fn)(const int16_t *, const float *, int64_t, int64_t, const uint8_t *, float *, int64_t, int64_t,
                        int64_t, const uint8_t *);
#define TILE_R(n, g16, f32)                                                                                    \
    static void tile_##n##_##g16##_##f32(const int16_t *xq, const float *xs, int64_t k, int64_t r0,             \
                                         const uint8_t *wt, float *out, int64_t out_stride, int64_t col,        \
                                         int64_t ncols, const uint8_t *pf) {                                    \
        tile_rows(xq, xs, k, r0, n, g16, f32, wt, out, out_stride, col, ncols, pf);                           \
    }
#define TILE_RS(g16, f32) \
    TILE_R(1, g16, f32) TILE_R(2, g16, f32) TILE_R(3, g16, f32) TILE_R(4, g16, f32) \
    TILE_R(5, g16, f32) TILE_R(6, g16, f32) TILE_R(7, g16, f32) TILE_R(8, g16, f32)
TILE_RS(0, 0) TILE_RS(0, 1) TILE_RS(1, 0) TILE_RS(1, 1)
#define TILE_ROW(g16, f32)                                                                                   \
    {0, tile_1_##g16##_##f32, tile_2_##g16##_##f32, tile_3_##g16##_##f32, tile_4_##g16##_##f32,            \
     tile_5_##g16##_##f32, tile_6_##g16##_##f32, tile_7_##g16##_##f32, tile_8_##g16##_##f32}
static const tile_fn TILES[2][2][9] = {{TILE_ROW(0, 0), TILE_ROW(0, 1)}, {TILE_ROW(1, 0), TILE_ROW(1, 1)}};

/* x [rows, k] (float32, or bfloat16 when x_bf16; row stride x_stride elements) @ W.T -> out
 * [rows, n] float32 (row stride out_stride), W packed by tr_i8x_pack for this n and k, x
 * quantised to xbits (16: ~15 bits, 8: int8 levels) per group of 32. scratch:
 * tr_i8x_scratch_bytes(rows, k) bytes, or NULL to allocate it here. */
int tr_i8x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads) {
    int64_t head[4];
    memcpy(head, w, sizeof head);
    if (rows < 0 || (xbits != 8 && xbits != 16) || head[0] != n || head[1] != k || bad_format(n, k, head[2], head[3]))
        return 3;
    if (rows == 0)
        return 0;
    void *mine = NULL;
    if (!scratch) {
        scratch = mine = malloc((size_t)tr_i8x_scratch_bytes(rows, k));
        if (!mine)
            return 1;
    }
    int16_t *q = (int16_t *)scratch;
    float *xs = (float *)((uint8_t *)scratch + q16_bytes(rows, k));
    const int64_t groups = k / GROUP, tiles = (n + TILE - 1) / TILE, bb = block_bytes(head[2], head[3]);
    const uint8_t *wt0 = w + HEADER;
    const tile_fn *fns = TILES[head[2] == 16][head[3] == 4];
    const float levels = xbits == 16 ? (float)XLEVELS16 : 127.0f;
#ifdef _OPENMP
    if (threads <= 0)
        threads = omp_get_max_threads();
    const int nt = rows * n * k >= PARALLEL_MIN && threads > 1 ? (tiles < threads ? (int)tiles : threads) : 1;
#pragma omp parallel num_threads(nt)
#endif
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num(), all = omp_get_num_threads();
#else
        const int me = 0, all = 1;
        (void)threads;
#endif
        for (int64_t r = rows * me / all; r < rows * (me + 1) / all; r++)
            quantize_row16(x_bf16 ? (const void *)((const uint16_t *)x + r * x_stride)
                                  : (const void *)((const float *)x + r * x_stride),
                           x_bf16, k, levels, q + r * k, xs + r * groups);
#ifdef _OPENMP
#pragma omp barrier
#endif
        const int64_t t0 = tiles * me / all, t1 = tiles * (me + 1) / all;
        for (int64_t t = t0; t < t1; t++) {
            const uint8_t *wt = wt0 + t * groups * bb, *next = t + 1 < t1 ? wt + groups * bb : NULL;
            for (int64_t r0 = 0; r0 < rows; r0 += R_MAX) {
                const int64_t nr = rows - r0 < R_MAX ? rows - r0 : R_MAX;
                fns[nr](q, xs, k, r0, wt, out, out_stride, t * TILE, n, r0 == 0 ? next : NULL);
            }
        }
    }
    free(mine);
    return 0;
}

#else /* no AVX2 + FMA + F16C in this build: every entry point says so (2) */

int tr_i8x_pack(const int8_t *codes, const float *scales, int64_t n, int64_t k, int64_t group, int64_t sbytes,
                uint8_t *out) {
    (void)codes; (void)scales; (void)n; (void)k; (void)group; (void)sbytes; (void)out;
    return 2;
}
int tr_i8x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads) {
    (void)x; (void)x_bf16; (void)x_stride; (void)rows; (void)k; (void)xbits; (void)w; (void)n; (void)out;
    (void)out_stride; (void)scratch; (void)threads;
    return 2;
}

#endif
