/* The LM head's exact rescoring: a quantised model whose head is held coarser than the file
 * gives it (SmolLM2's Q8_0 embedding as int4) recomputes each row's k highest logits from the
 * file's own codes (`Model.logits`). In torch that is a top-k, a gather and dequantisation of
 * k rows, a product, a sum and a scatter per step; here one pass a row.
 *
 * Per row r, independently of the others (so a request's logits do not depend on its batch):
 * the k largest of lg[r, 0:v] (ties: the lower index first; NaN never selected), then each
 * selected j's logit recomputed as sum over i, in index order, of (q[j, i] * s[j, i / group]) *
 * h[r, i], in float32: the dequantised weight (the code times its group's scale, as
 * `QuantTensor.dequantize` forms it) times the input, accumulated in order. */
#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

#define MAX_K 64

static int64_t top_k(const float *row, int64_t v, int64_t k, int64_t *idx) {
    float val[MAX_K];
    int64_t n = 0;
    for (int64_t j = 0; j < v; j++) {
        const float x = row[j];
        if (x != x || (n == k && !(x > val[n - 1]))) /* NaN, or not above the k-th */
            continue;
        int64_t p = n < k ? n++ : k - 1;
        while (p > 0 && x > val[p - 1]) { /* strictly greater: an equal value keeps its earlier place */
            val[p] = val[p - 1];
            idx[p] = idx[p - 1];
            p--;
        }
        val[p] = x;
        idx[p] = j;
    }
    return n;
}

/* lg [rows, v] float32 (row stride lg_stride), rescored in place; h [rows, hdim] float32 (row
 * stride h_stride); codes [v, hdim] int8, scales [v, hdim / group] float32. Returns 0, or 3 for
 * a k over MAX_K or a group that does not divide hdim. */
int tr_rescore_top(float *lg, int64_t lg_stride, int64_t rows, int64_t v, const float *h, int64_t h_stride,
                   int64_t hdim, const int8_t *codes, const float *scales, int64_t group, int64_t k,
                   int64_t threads) {
    if (k < 1 || k > MAX_K || group < 1 || hdim % group)
        return 3;
    const int64_t groups = hdim / group;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        float *row = lg + r * lg_stride;
        const float *x = h + r * h_stride;
        int64_t idx[MAX_K];
        const int64_t n = top_k(row, v, k, idx);
        for (int64_t t = 0; t < n; t++) {
            const int8_t *q = codes + idx[t] * hdim;
            const float *s = scales + idx[t] * groups;
            float acc = 0.0f;
            for (int64_t i = 0; i < hdim; i++)
                acc += ((float)q[i] * s[i / group]) * x[i];
            row[idx[t]] = acc;
        }
    }
    return 0;
}
