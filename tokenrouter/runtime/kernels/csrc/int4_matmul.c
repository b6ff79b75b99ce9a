/* y = x @ W.T for a 4-bit matrix W, on AVX-512 bfloat16 dot products (`vdpbf16ps`).
 *
 * Why: torch's CPU int4 kernel unpacks the codes again for every row of x, so a decode step
 * of 8 requests costs about 2.8x one of 1 (benchmarks/README.md). Here each block of codes
 * is unpacked once into registers and used for up to 8 rows.
 *
 * W [N, K] is held as codes q in 0..15 with, per output row and group of 32 inputs, a scale s
 * and a min m: w = q s + m (Q4_1's form; Q4_0 and Q4_K map onto it exactly, quant.py). Then
 *
 *     y[n] = sum over groups g of  s * sum_i x_i q_i  +  m * sum_i x_i
 *
 * The codes enter the dot products as the bfloat16 numbers 128 + q (exact: 0x4300 | q), so
 * unpacking is a shift and a mask; the bias is taken out with the group's sum of x:
 * s * sum x_i (128 + q_i) + (m - 128 s) * sum x_i. x is rounded to bfloat16 once per call
 * (the int4 kernel's activation dtype); products and sums are float32, and so is the output.
 * s and m are held as float16 (exact for Q4_0/Q4_1, whose file stores them so).
 *
 * Layout (packed by quant.Int4DotWeight): for each block of 16 output rows and group g, 4
 * chunks of 16 uint32, one per output row, holding 8 codes of inputs 8c..8c+7: the pair of
 * inputs (2k, 2k+1) at bits 4k and 16 + 4k, so that (D >> 4k) & 0x000F000F is pair k's two
 * codes in one 32-bit lane, the low and high halves of a bfloat16 pair. Then [16 s, 16 m]
 * float16 per block and group.
 *
 * Each row is computed by the same sequence of operations whatever the number of rows and
 * threads (threads split output blocks), so a request's values do not depend on its batch.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define TR_INT4DP 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define TR_INT4AMX 1
#endif
#endif

int tr_int4dp_supported(void) {
#ifdef TR_INT4DP
    return 1;
#else
    return 0;
#endif
}

/* AMX tiles need the kernel's leave to use their state, asked once per process */
int tr_int4amx_supported(void) {
#ifdef TR_INT4AMX
    static int ok = -1;
    if (ok < 0)
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return ok;
#else
    return 0;
#endif
}

#ifdef TR_INT4DP

#define ROWS 8        /* rows that share one unpacking */
#define PARALLEL_MIN (1 << 16)

/* One chunk of the packed codes (16 outputs x 8 inputs) as 4 input pairs of bfloat16 128 + q */
static inline void unpack_chunk(const uint32_t *chunk, __m512i w[4]) {
    const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
    const __m512i d = _mm512_loadu_si512((const void *)chunk);
    w[0] = _mm512_ternarylogic_epi32(d, mask, bias, 0xEA); /* (a & b) | c */
    w[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(d, 4), mask, bias, 0xEA);
    w[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(d, 8), mask, bias, 0xEA);
    w[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(d, 12), mask, bias, 0xEA);
}

/* A group's 16 scales s, and c = m - 128 s, which takes the codes' bias of 128 out */
static inline void group_scales(const uint16_t *smg, __m512 *s, __m512 *c) {
    *s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)smg));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(smg + 16)));
    *c = _mm512_fnmadd_ps(_mm512_set1_ps(128.0f), *s, m);
}

/* One block of 16 outputs for rows [r0, r0 + nr), nr <= ROWS. Per group, each chunk of 4
 * input pairs is unpacked once and used by every row; a row's dot products run on two
 * accumulators (pairs 0, 2 and 1, 3 of each chunk) so that one row alone is not held up by
 * the instruction's latency, and are summed per group in the same order for every row. */
static inline __attribute__((always_inline)) void
block(const uint32_t *xp, const float *xs, int64_t r0, const int nr, int64_t groups, const uint32_t *codes,
      const uint16_t *sm, float *out, int64_t out_stride, int64_t col) {
    __m512 tot[ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        tot[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint32_t *cg = codes + g * 64;
        __m512 a0[ROWS], a1[ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            a0[r] = a1[r] = _mm512_setzero_ps();
        for (int ch = 0; ch < 4; ch++) {
            __m512i w[4];
            unpack_chunk(cg + ch * 16, w);
#pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                const uint32_t *x = xp + (r0 + r) * groups * 16 + g * 16 + ch * 4;
                a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w[0], (__m512bh)_mm512_set1_epi32((int)x[0]));
                a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w[1], (__m512bh)_mm512_set1_epi32((int)x[1]));
                a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w[2], (__m512bh)_mm512_set1_epi32((int)x[2]));
                a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w[3], (__m512bh)_mm512_set1_epi32((int)x[3]));
            }
        }
        __m512 s, c;
        group_scales(sm + g * 32, &s, &c);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            tot[r] = _mm512_fmadd_ps(s, _mm512_add_ps(a0[r], a1[r]), tot[r]);
            tot[r] = _mm512_fmadd_ps(c, _mm512_set1_ps(xs[(r0 + r) * groups + g]), tot[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        _mm512_storeu_ps(out + (r0 + r) * out_stride + col, tot[r]);
}

/* `block` compiled for each row count, so that its per-row values live in registers */
#define BLOCK_N(n) \
    static void block##n(const uint32_t *xp, const float *xs, int64_t r0, int64_t groups, const uint32_t *codes, \
                         const uint16_t *sm, float *out, int64_t out_stride, int64_t col) { \
        block(xp, xs, r0, n, groups, codes, sm, out, out_stride, col); \
    }
BLOCK_N(1) BLOCK_N(2) BLOCK_N(3) BLOCK_N(4) BLOCK_N(5) BLOCK_N(6) BLOCK_N(7) BLOCK_N(8)
typedef void (*block_fn)(const uint32_t *, const float *, int64_t, int64_t, const uint32_t *, const uint16_t *,
                         float *, int64_t, int64_t);
static const block_fn BLOCKS[ROWS + 1] = {0, block1, block2, block3, block4, block5, block6, block7, block8};

#ifdef TR_INT4AMX
/* The same product on AMX tiles: per block and group, the unpacked codes (16 input pairs x 16
 * outputs, exactly the B tile's layout) are stored once and one `tdpbf16ps` multiplies them
 * by up to 16 rows of x; each row's group sum is then scaled as in `block`. A separate kernel
 * (`int4amx`): its float32 sums run in another order than `block`'s. */
#define AROWS 16

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static void amx_config(int nr) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t += 3) { /* two sets, for two groups in flight */
        c.rows[t] = (uint8_t)nr; c.colsb[t] = 64;         /* C: nr rows x 16 float32 */
        c.rows[t + 1] = (uint8_t)nr; c.colsb[t + 1] = 64; /* A: nr rows x 16 bfloat16 pairs */
        c.rows[t + 2] = 16; c.colsb[t + 2] = 64;          /* B: 16 pairs x 16 outputs */
    }
    _tile_loadconfig(&c);
}

/* a group's codes, unpacked into the B tile's 16 rows */
static inline void unpack_to(uint32_t *bbuf, const uint32_t *cg) {
    for (int ch = 0; ch < 4; ch++) {
        __m512i w[4];
        unpack_chunk(cg + ch * 16, w);
        for (int p = 0; p < 4; p++)
            _mm512_store_si512((void *)(bbuf + (ch * 4 + p) * 16), w[p]);
    }
}

static inline void scale_into(float *tot, const float *cbuf, const uint16_t *smg, const float *xs, int64_t r0,
                              int nr, int64_t groups, int64_t g) {
    __m512 s, c;
    group_scales(smg, &s, &c);
    for (int r = 0; r < nr; r++) {
        __m512 t = _mm512_fmadd_ps(s, _mm512_load_ps(cbuf + r * 16), _mm512_load_ps(tot + r * 16));
        t = _mm512_fmadd_ps(c, _mm512_set1_ps(xs[(r0 + r) * groups + g]), t);
        _mm512_store_ps(tot + r * 16, t);
    }
}

static void amx_block(const uint32_t *xp, const float *xs, int64_t r0, int nr, int64_t groups,
                      const uint32_t *codes, const uint16_t *sm, float *out, int64_t out_stride, int64_t col,
                      uint32_t *bbuf, float *cbuf, float *tot) {
    memset(tot, 0, (size_t)nr * 16 * sizeof *tot);
    const uint32_t *xa = xp + r0 * groups * 16;
    /* groups go in pairs on tile sets 0-2 and 3-5; a pair's products are scaled into `tot`
     * after the next pair's tile work is issued, so the tiles' latency overlaps the unpacking.
     * Buffers alternate between pairs (bbuf and cbuf hold 2 x 2 x 256 entries). */
    int64_t prev = -1;
    for (int64_t g = 0; g < groups; g += 2) {
        const int two = g + 1 < groups, half = (int)((g / 2) & 1);
        uint32_t *bb = bbuf + half * 512;
        float *cb = cbuf + half * 512;
        unpack_to(bb, codes + g * 64);
        if (two)
            unpack_to(bb + 256, codes + (g + 1) * 64);
        _tile_zero(0);
        _tile_loadd(1, xa + g * 16, groups * 64);
        _tile_loadd(2, bb, 64);
        _tile_dpbf16ps(0, 1, 2);
        if (two) {
            _tile_zero(3);
            _tile_loadd(4, xa + (g + 1) * 16, groups * 64);
            _tile_loadd(5, bb + 256, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, cb, 64);
        if (two)
            _tile_stored(3, cb + 256, 64);
        if (prev >= 0) {
            const float *pc = cbuf + (1 - half) * 512;
            scale_into(tot, pc, sm + prev * 32, xs, r0, nr, groups, prev);
            if (prev + 1 < groups)
                scale_into(tot, pc + 256, sm + (prev + 1) * 32, xs, r0, nr, groups, prev + 1);
        }
        prev = g;
    }
    const float *pc = cbuf + ((prev / 2) & 1) * 512;
    scale_into(tot, pc, sm + prev * 32, xs, r0, nr, groups, prev);
    if (prev + 1 < groups)
        scale_into(tot, pc + 256, sm + (prev + 1) * 32, xs, r0, nr, groups, prev + 1);
    for (int r = 0; r < nr; r++)
        memcpy(out + (r0 + r) * out_stride + col, tot + r * 16, 16 * sizeof *tot);
}
#endif

/* x [rows, K] (bfloat16 when x_bf16, else float32; row stride x_stride elements), codes and
 * sm as packed above for N outputs, out [rows, N] float32 (row stride out_stride). K % 32 == 0,
 * N % 16 == 0. Returns 0, or 1 when scratch memory could not be had. */
int tr_int4dp_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, const uint32_t *codes,
                 const uint16_t *sm, int64_t n, float *out, int64_t out_stride, int threads, int amx) {
    const int64_t groups = k / 32, blocks = n / 16;
    if (amx && !tr_int4amx_supported())
        return 2;
    uint32_t *xp = malloc((size_t)(rows * k / 2) * sizeof *xp);
    float *xs = malloc((size_t)(rows * groups) * sizeof *xs);
    if (!xp || !xs) {
        free(xp);
        free(xs);
        return 1;
    }
    for (int64_t r = 0; r < rows; r++) { /* x as bfloat16 (pairs: little-endian uint32), each group's sum */
        for (int64_t g = 0; g < groups; g++) {
            __m256i lo, hi; /* 16 + 16 bfloat16 */
            if (x_bf16) {
                const uint16_t *src = (const uint16_t *)x + r * x_stride + g * 32;
                lo = _mm256_loadu_si256((const __m256i *)src);
                hi = _mm256_loadu_si256((const __m256i *)(src + 16));
            } else { /* round to nearest even, as torch's cast */
                const float *src = (const float *)x + r * x_stride + g * 32;
                lo = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src));
                hi = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + 16));
            }
            _mm256_storeu_si256((__m256i *)(xp + r * groups * 16 + g * 16), lo);
            _mm256_storeu_si256((__m256i *)(xp + r * groups * 16 + g * 16 + 8), hi);
            const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(lo), 16));
            const __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
            xs[r * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
        }
    }
#ifdef _OPENMP
    const int nt = rows * n * k >= PARALLEL_MIN && threads > 1 ? threads : 1;
#endif
#ifdef TR_INT4AMX
    if (amx) {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
        {
            uint32_t bbuf[1024] __attribute__((aligned(64)));
            float cbuf[1024] __attribute__((aligned(64))), tot[AROWS * 16] __attribute__((aligned(64)));
            int configured = 0; /* the A and C tiles' row count, per thread */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t b = 0; b < blocks; b++) {
                for (int64_t r0 = 0; r0 < rows; r0 += AROWS) {
                    const int nr = (int)(rows - r0 < AROWS ? rows - r0 : AROWS);
                    if (nr != configured) {
                        amx_config(nr);
                        configured = nr;
                    }
                    amx_block(xp, xs, r0, nr, groups, codes + b * groups * 64, sm + b * groups * 32, out, out_stride,
                              b * 16, bbuf, cbuf, tot);
                }
            }
            if (configured)
                _tile_release();
        }
        free(xp);
        free(xs);
        return 0;
    }
#endif
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
            const int64_t nr = rows - r0 < ROWS ? rows - r0 : ROWS;
            BLOCKS[nr](xp, xs, r0, groups, codes + b * groups * 64, sm + b * groups * 32, out, out_stride, b * 16);
        }
    }
    free(xp);
    free(xs);
    return 0;
}

#else

int tr_int4dp_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, const uint32_t *codes,
                 const uint16_t *sm, int64_t n, float *out, int64_t out_stride, int threads, int amx) {
    (void)x; (void)x_bf16; (void)x_stride; (void)rows; (void)k; (void)codes; (void)sm; (void)n; (void)out;
    (void)out_stride; (void)threads; (void)amx;
    return 2; /* not built for this CPU: tr_int4dp_supported() says 0 */
}

#endif
