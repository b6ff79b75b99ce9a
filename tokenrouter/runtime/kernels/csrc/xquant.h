/* What the integer kernels (int4_avx2.c, int8_avx2.c) share: which instruction set a build
 * holds, and the quantisation of a group of 32 activations to integers.
 *
 * TR_I4X_ISA: 3 AVX-512 VNNI, 2 AVX-VNNI, 1 AVX2, 0 none, from the -march macros. It can be
 * forced lower (tests); TR_I4X_EMULATE_VNNI runs the AVX-VNNI path's structure with its dot
 * products emulated on AVX2, TR_I4X_EMULATE_512 the AVX-512 path's (16 lanes as two ymm
 * halves, dot products emulated), so that hosts without those instructions test their
 * code's indexing and order.
 *
 * A group of 32 activations x (float32, or bfloat16) becomes integers Q = round(x / dx) with
 * dx = max|x| / L (round to nearest even, the default MXCSR; dx = 0 and Q = 0 for a group of
 * zeros): `quant_group` gives Q as four vectors of 8 int32 and dx. */
#ifndef TR_XQUANT_H
#define TR_XQUANT_H
#include <stdint.h>
#include <string.h>

#ifndef TR_I4X_ISA
#if defined(TR_I4X_EMULATE_512) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TR_I4X_ISA 3
#elif defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__) && defined(__F16C__) && defined(__FMA__)
#define TR_I4X_ISA 3
#elif (defined(__AVXVNNI__) || defined(TR_I4X_EMULATE_VNNI)) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TR_I4X_ISA 2
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TR_I4X_ISA 1
#else
#define TR_I4X_ISA 0
#endif
#endif

#if TR_I4X_ISA >= 1
#include <immintrin.h>

#define XLEVELS16 32258 /* 127 * 254: 16-bit activations (two int8 digits in int4_avx2.c) */

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline __m256 load8(const void *x, int bf16, int64_t i) {
    if (bf16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + i))), 16));
    return _mm256_loadu_ps((const float *)x + i);
}

static inline int32_t hsum_i32(const __m256i qi[4]) {
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    return _mm_cvtsi128_si32(s4);
}

/* Q (four vectors of 8 int32, inputs 8i..8i+7 in qi[i]) and dx of the 32 activations at
 * x + i0, quantised to `levels` (127 or XLEVELS16) */
static inline float quant_group(const void *x, int bf16, int64_t i0, float levels, __m256i qi[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = load8(x, bf16, i0 + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    const float a = hmax8(amax);
    const __m256 id = _mm256_set1_ps(a > 0.0f ? levels / a : 0.0f);
    for (int i = 0; i < 4; i++) /* round to nearest even (the default MXCSR) */
        qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    return a / levels;
}

static inline int32_t load4(const void *p) { /* 4 bytes, unaligned */
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The vectors of LANES 32-bit lanes both kernels compute in (vi: int32, vf: float32), one
 * output per lane: a ymm (8), a zmm (16), or, emulating AVX-512 on AVX2, a pair of ymm. */
#if TR_I4X_ISA == 3 && defined(TR_I4X_EMULATE_512)
#define LANES 16
typedef struct { __m256i a, b; } vi;
typedef struct { __m256 a, b; } vf;
static inline vi e_set1_32(int v) { vi r = {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; return r; }
static inline vi e_zero(void) { vi r = {_mm256_setzero_si256(), _mm256_setzero_si256()}; return r; }
static inline vf e_cvt(vi x) { vf r = {_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)}; return r; }
static inline vf e_half(const void *p) {
    vf r = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const char *)p + 16)))};
    return r;
}
static inline vf e_loadf(const void *p) {
    vf r = {_mm256_loadu_ps((const float *)p), _mm256_loadu_ps((const float *)p + 8)};
    return r;
}
static inline vf e_f1(float f) { vf r = {_mm256_set1_ps(f), _mm256_set1_ps(f)}; return r; }
static inline vf e_fzero(void) { vf r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline vf e_mul(vf x, vf y) { vf r = {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; return r; }
static inline vf e_fma(vf x, vf y, vf z) {
    vf r = {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)};
    return r;
}
static inline void e_store(float *p, vf v) { _mm256_storeu_ps(p, v.a); _mm256_storeu_ps(p + 8, v.b); }
#define VBCAST32 e_set1_32
#define VZERO e_zero
#define VCVT e_cvt
#define VHALF e_half
#define VLOADF e_loadf
#define VF1 e_f1
#define VFZERO e_fzero
#define VMUL e_mul
#define VFMA e_fma
#define VSTORE e_store
#elif TR_I4X_ISA == 3
#define LANES 16
typedef __m512i vi;
typedef __m512 vf;
#define VBCAST32 _mm512_set1_epi32
#define VZERO _mm512_setzero_si512
#define VCVT _mm512_cvtepi32_ps
#define VHALF(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VLOADF(p) _mm512_loadu_ps((const void *)(p))
#define VF1 _mm512_set1_ps
#define VFZERO _mm512_setzero_ps
#define VMUL _mm512_mul_ps
#define VFMA _mm512_fmadd_ps
#define VSTORE _mm512_storeu_ps
#else
#define LANES 8
typedef __m256i vi;
typedef __m256 vf;
#define VBCAST32 _mm256_set1_epi32
#define VZERO _mm256_setzero_si256
#define VCVT _mm256_cvtepi32_ps
#define VHALF(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VLOADF(p) _mm256_loadu_ps((const float *)(p))
#define VF1 _mm256_set1_ps
#define VFZERO _mm256_setzero_ps
#define VMUL _mm256_mul_ps
#define VFMA _mm256_fmadd_ps
#define VSTORE _mm256_storeu_ps
#endif

/* R rows' accumulators of outputs c0 .. c0 + LANES - 1 into out (row r0 + r at out +
 * (r0 + r) * out_stride), only the columns below ncols (the last tile of an N that is not a
 * multiple of 16) */
static inline __attribute__((always_inline)) void store_rows(const vf *acc, const int R, float *out,
                                                             int64_t out_stride, int64_t r0, int64_t c0,
                                                             int64_t ncols) {
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *o = out + (r0 + r) * out_stride + c0;
        if (c0 + LANES <= ncols) {
            VSTORE(o, acc[r]);
        } else if (c0 < ncols) {
            float tmp[LANES];
            VSTORE(tmp, acc[r]);
            memcpy(o, tmp, (size_t)(ncols - c0) * sizeof(float));
        }
    }
}
#endif

#endif
