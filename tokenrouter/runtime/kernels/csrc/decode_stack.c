/* A decoder's layers for a decode step in one call, where the engine's fused path makes nine
 * calls a layer (four products, RoPE and the K/V write, attention, SwiGLU, two norms), each
 * with its dispatch, checks and output allocation: about 270 calls a SmolLM2 step, most of a
 * step's time outside the products at batch 1.
 *
 * `tr_decode_stack` runs layers l0 .. l1-1 of a Llama-family decoder (the model: `tr_stack`,
 * pointers the engine fills once) over the step's rows, every matrix on the 4-bit C kernel
 * its plan chose (`tr_mat`: the integer int4 kernel of `int4_avx2.c`, `int4_matmul.c`'s on
 * AVX-512 bfloat16 dot products or AMX tiles, or the integer 8-bit kernel of `int8_avx2.c`; a
 * layer may mix them, and a fused matrix may be parts on different kernels), every token's
 * attention on the paged C kernel, in the order and with the very calls the engine's fused
 * path makes (`Model._fused_layers`: float32 x, which each kernel rounds itself), so the
 * results are the same bits: per layer
 *
 *     qkv = x Wqkv^T (+ b);  rope_write(qkv) -> q, cache;  o = attention(q);
 *     h += o Wo^T (+ b);  x = rmsnorm(h) ln2;  act = silu(gate) up  for  x Wgu^T;
 *     h += act Wdown^T;  x = rmsnorm(h) ln1[next]
 *
 * The residual stream h [rows, hidden] is updated in place; the intermediate rows live in
 * `work` (tr_decode_stack_work_floats) and the integer kernel's quantised activations in
 * `scratch` (tr_i4x_scratch_bytes for the widest input), both the caller's, reused from step
 * to step (`tr_int4dp_mm` allocates its bfloat16 copy of x itself, as in the per-call path).
 * Each row is computed as in the per-call path (every kernel here computes a row on its own),
 * so batch invariance holds as there.
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* One matrix and the kernel that runs it (`linear.PlannedLinear`'s plan), or a matrix fused
 * from parts of different formats (q/k/v of a GGUF whose v is stored in another block type),
 * each part on its own kernel writing its columns of the output */
enum { TR_MAT_I4X = 0 /* tr_i4x_mm */, TR_MAT_DP = 1 /* tr_int4dp_mm */, TR_MAT_I8X = 2 /* tr_i8x_mm */,
       TR_MAT_PARTS = 3 };
typedef struct tr_mat {
    const uint8_t *packed;  /* TR_MAT_I4X, TR_MAT_I8X: the packed weights (tr_i4x_pack, tr_i8x_pack) */
    const uint32_t *codes;  /* TR_MAT_DP: the codes and the float16 scales and mins (quant.Int4DotWeight) */
    const uint16_t *sm;
    int32_t kernel;         /* TR_MAT_I4X, TR_MAT_DP, TR_MAT_I8X or TR_MAT_PARTS */
    int32_t xbits;          /* TR_MAT_I4X, TR_MAT_I8X: the activations' bits, 8 or 16 */
    int32_t amx;            /* TR_MAT_DP: 1 on AMX tiles (`int4amx`), 0 on dot products (`int4dp`) */
    int32_t nparts;         /* TR_MAT_PARTS: how many parts, in `parts` (each a matrix of one kernel) */
    int64_t n;              /* a part's output rows (its columns of the fused output) */
    const struct tr_mat *parts;
} tr_mat;

typedef struct {
    int64_t layers, hidden, inter, heads, kv_heads, head_dim;
    float eps, scale;
    int64_t num_blocks, block_size;   /* each layer's cache: [2 kv_heads, num_blocks, block_size, head_dim] */
    /* per layer (arrays of `layers` pointers; qk_norm and the biases may hold NULLs) */
    const float *const *ln1, *const *ln2, *const *qk_norm, *const *qkv_bias, *const *o_bias;
    const tr_mat *mats;               /* [layers, 4]: qkv, o, gate_up, down */
    void *const *kv;
    int64_t kv_type;                  /* the cache's elements: 0 float32, 1 float16, 2 bfloat16 */
} tr_stack;

/* floats of `work` a step of `rows` rows needs */
int64_t tr_decode_stack_work_floats(const tr_stack *m, int64_t rows) {
    const int64_t qkv = (m->heads + 2 * m->kv_heads) * m->head_dim, q = m->heads * m->head_dim;
    return rows * (m->hidden /* x */ + qkv + 2 * q /* q, o */ + m->hidden /* y */ + 3 * m->inter /* gu, act */);
}

static void add_bias(float *y, int64_t rows, int64_t n, const float *b) {
    if (!b)
        return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++)
            y[r * n + i] += b[i];
}

/* out [rows, n] (row stride out_stride) = x [rows, k] W^T, x float32 with contiguous rows, on
 * w's kernel (each part on its own, into its columns), called as the per-call path calls it
 * (`bindings.int4x_mm`, `bindings.int4dp_mm`, `int8x.int8x_mm`) */
static int mat_mul(const tr_mat *w, const float *x, int64_t rows, int64_t k, int64_t n, float *out, int64_t out_stride,
                   void *scratch, int threads) {
    switch (w->kernel) {
    case TR_MAT_I4X:
        return tr_i4x_mm(x, 0, k, rows, k, w->xbits, w->packed, n, out, out_stride, scratch, threads);
    case TR_MAT_DP:
        return tr_int4dp_mm(x, 0, k, rows, k, w->codes, w->sm, n, out, out_stride, threads, w->amx);
    case TR_MAT_I8X:
        return tr_i8x_mm(x, 0, k, rows, k, w->xbits, w->packed, n, out, out_stride, scratch, threads);
    case TR_MAT_PARTS: {
        int64_t col = 0;
        for (int32_t p = 0; p < w->nparts; p++) {
            const int rc = mat_mul(&w->parts[p], x, rows, k, w->parts[p].n, out + col, out_stride, scratch, threads);
            if (rc)
                return rc;
            col += w->parts[p].n;
        }
        return col == n ? 0 : 3;
    }
    default:
        return 3;
    }
}

/* Returns 0, or the first failing kernel's code (1: no memory, 2: not built here, 3: bad arguments). */
int tr_decode_stack(const tr_stack *m, int64_t l0, int64_t l1, float *h, int64_t rows, const float *cis,
                    const int64_t *positions, const int64_t *slots, const int64_t *tables, int64_t table_stride,
                    const int64_t *att_rows, const int64_t *reqs, const int64_t *lens, float *work, void *scratch,
                    int threads) {
    if (l0 < 0 || l1 > m->layers || l0 >= l1 || rows <= 0 || m->heads % m->kv_heads)
        return 3;
    const int64_t H = m->hidden, I = m->inter, hd = m->head_dim;
    const int64_t nqkv = (m->heads + 2 * m->kv_heads) * hd, nq = m->heads * hd;
    float *x = work, *qkv = x + rows * H, *q = qkv + rows * nqkv, *o = q + rows * nq, *y = o + rows * nq;
    float *gu = y + rows * H, *act = gu + rows * 2 * I;
    int rc;
    tr_add_rmsnorm(h, H, NULL, 0, 0, m->ln1[l0], m->eps, x, 0, H, rows, H, threads);
    for (int64_t l = l0; l < l1; l++) {
        const tr_mat *w = m->mats + 4 * l;
        if ((rc = mat_mul(&w[0], x, rows, H, nqkv, qkv, nqkv, scratch, threads)))
            return rc;
        add_bias(qkv, rows, nqkv, m->qkv_bias[l]);
        tr_rope_write(qkv, 0, nqkv, rows, m->heads, m->kv_heads, hd, cis, positions, m->qk_norm[l], m->eps,
                      m->kv[l], (int)m->kv_type, m->num_blocks * m->block_size, slots, q, nq, threads);
        if (tr_paged_attention(q, nq, m->kv[l], (int)m->kv_type, m->num_blocks, m->block_size, m->kv_heads,
                               m->heads / m->kv_heads, hd, tables, table_stride, att_rows, reqs, lens, rows,
                               m->scale, o, nq, threads))
            return 1;
        if ((rc = mat_mul(&w[1], o, rows, nq, H, y, H, scratch, threads)))
            return rc;
        add_bias(y, rows, H, m->o_bias[l]);
        tr_add_rmsnorm(h, H, y, 0, H, m->ln2[l], m->eps, x, 0, H, rows, H, threads);
        if ((rc = mat_mul(&w[2], x, rows, H, 2 * I, gu, 2 * I, scratch, threads)))
            return rc;
        tr_silu_mul(gu, 0, 2 * I, act, 0, I, rows, I, threads);
        if ((rc = mat_mul(&w[3], act, rows, I, H, y, H, scratch, threads)))
            return rc;
        const float *next = l + 1 < l1 ? m->ln1[l + 1] : NULL;
        tr_add_rmsnorm(h, H, y, 0, H, next, m->eps, next ? x : NULL, 0, H, rows, H, threads);
    }
    return 0;
}
