/* The LM head's exact rescoring: a quantised model whose head is held coarser than the file
 * gives it (SmolLM2's Q8_0 embedding, Qwen's Q8_0 or Q6_K output matrix, as int4) recomputes each
 * row's k highest logits from the file's own values (`Model.logits`). In torch that is a top-k,
 * a gather and dequantisation of k rows, a product, a sum and a scatter per step; here one pass
 * a row.
 *
 * Per row r, independently of the others (so a request's logits do not depend on its batch):
 * the k largest of lg[r, 0:v] (ties: the lower index first; NaN never selected), then each
 * selected j's logit recomputed as sum over i, in index order, of w[j, i] * h[r, i] in float32,
 * w[j, :] being the row's float values: from int8 codes q and float32 scales s (type
 * TR_CODES: q[j, i] * s[j, i / group], as `QuantTensor.dequantize` forms it), or from the GGUF
 * blocks of the row (a ggml type: `tr_gguf_dequant_row`, the `gguf` package's values). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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
 * stride h_stride); the rows of W: type TR_CODES (-1): data int8 codes [v, hdim], scales
 * [v, hdim / group] float32; else a ggml type, row j at data + j * row_bytes (scales, group
 * unused). Returns 0, 1 without memory, or 3 for a k over MAX_K, a group that does not divide
 * hdim or a type tr_gguf_dequant_row refuses. */
int tr_rescore_top(float *lg, int64_t lg_stride, int64_t rows, int64_t v, const float *h, int64_t h_stride,
                   int64_t hdim, int type, const void *data, int64_t row_bytes, const float *scales, int64_t group,
                   int64_t k, int64_t threads) {
    if (k < 1 || k > MAX_K || (type == TR_CODES && (group < 1 || hdim % group)) ||
        (type != TR_CODES && !tr_gguf_supported(type)))
        return 3;
    int rc = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1 && rows > 1)
#endif
    {
        float *w = malloc((size_t)hdim * sizeof(float));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t r = 0; r < rows; r++) {
            if (!w) {
                rc = 1;
                continue;
            }
            float *row = lg + r * lg_stride;
            const float *x = h + r * h_stride;
            int64_t idx[MAX_K];
            const int64_t n = top_k(row, v, k, idx);
            for (int64_t t = 0; t < n; t++) {
                if (type == TR_CODES) {
                    const int8_t *q = (const int8_t *)data + idx[t] * hdim;
                    const float *s = scales + idx[t] * (hdim / group);
                    for (int64_t i = 0; i < hdim; i++)
                        w[i] = (float)q[i] * s[i / group];
                } else if (tr_gguf_dequant_row(type, (const uint8_t *)data + idx[t] * row_bytes, hdim, w)) {
                    rc = 3;
                    break;
                }
                float acc = 0.0f;
                for (int64_t i = 0; i < hdim; i++)
                    acc += w[i] * x[i];
                row[idx[t]] = acc;
            }
        }
        free(w);
    }
    return rc;
}
