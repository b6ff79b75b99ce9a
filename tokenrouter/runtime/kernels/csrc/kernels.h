/* The C kernels' entry points that other kernels call (decode_stack.c runs a decoder's layers
 * through them); each is documented where it is defined. */
#ifndef TR_KERNELS_H
#define TR_KERNELS_H
#include <stdint.h>

int tr_paged_attention(const float *q, int64_t q_stride, const void *kv, int kv_type, int64_t num_blocks,
                       int64_t block_size, int64_t kv_heads, int64_t q_per_kv, int64_t head_dim,
                       const int64_t *tables, int64_t table_stride, const int64_t *rows,
                       const int64_t *reqs, const int64_t *lens, int64_t n_tok, float scale,
                       float *out, int64_t out_stride, int64_t threads);
void tr_add_rmsnorm(float *h, int64_t h_stride, const void *y, int y_bf16, int64_t y_stride, const float *w,
                    float eps, void *out, int out_bf16, int64_t out_stride, int64_t rows, int64_t cols,
                    int64_t threads);
void tr_silu_mul(const void *gu, int gu_bf16, int64_t gu_stride, void *act, int act_bf16, int64_t act_stride,
                 int64_t rows, int64_t inter, int64_t threads);
void tr_rope_write(const void *qkv, int qkv_bf16, int64_t qkv_stride, int64_t rows, int64_t heads,
                   int64_t kv_heads, int64_t hd, const float *cis, const int64_t *positions,
                   const float *qk_norm, float eps, void *kv, int kv_type, int64_t slots_per_head,
                   const int64_t *slots, float *q_out, int64_t q_stride, int64_t threads);
int64_t tr_i4x_scratch_bytes(int64_t rows, int64_t k);
int tr_i4x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads);
int64_t tr_i8x_scratch_bytes(int64_t rows, int64_t k);
int tr_i8x_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, int xbits, const uint8_t *w,
              int64_t n, float *out, int64_t out_stride, void *scratch, int threads);
int tr_int4dp_mm(const void *x, int x_bf16, int64_t x_stride, int64_t rows, int64_t k, const uint32_t *codes,
                 const uint16_t *sm, int64_t n, float *out, int64_t out_stride, int threads, int amx);
/* gguf_rows.c: ggml block types (TR_CODES: int8 codes with float32 scales, head_rescore.c) */
#define TR_CODES (-1)
int tr_gguf_supported(int type);
int tr_gguf_dequant_row(int type, const uint8_t *row, int64_t k, float *y);

#endif
