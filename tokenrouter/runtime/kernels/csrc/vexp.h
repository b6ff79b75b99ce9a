/* exp(x) for float32 without a libm call, so loops over it vectorise (libm's expf is a
 * scalar call per element): exp(x) = 2^k * e^f with k = round(x log2 e) (by the 1.5 * 2^23
 * trick), |f| <= ln 2 / 2, e^f from its degree-7 Taylor polynomial (relative error under
 * 1e-8 before float rounding). x is clamped to [-87, 88]: exp(-87) ~ 1.6e-38 is the smallest
 * normal float's order, exp(88) ~ 1.7e38 the largest's. Shared by the C kernels. */
#ifndef TOKENROUTER_VEXP_H
#define TOKENROUTER_VEXP_H

#include <stdint.h>
#include <string.h>

static inline float tr_exp(float x) {
    const float round_magic = 12582912.0f;
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float t = x * 1.44269504088896341f;
    const float k = (t + round_magic) - round_magic;
    const float f = (t - k) * 0.693147180559945309f;
    float p = 1.0f / 5040.0f;
    p = p * f + 1.0f / 720.0f;
    p = p * f + 1.0f / 120.0f;
    p = p * f + 1.0f / 24.0f;
    p = p * f + 1.0f / 6.0f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

#endif
