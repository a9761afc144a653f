/*
 * The engine's private state (engine.c, engine_open.c): the weights as staged
 * and the run state of one token, llama2.c-style, a shape comment on every
 * buffer. Nothing outside native/engine includes this: the API is llm.h.
 */
#ifndef LLM_ENGINE_STATE_H
#define LLM_ENGINE_STATE_H

#include "head.h"
#include "image.h"
#include "kernels.h"
#include "llm.h"
#include "sampler.h"
#include "wmat.h"

/* A matrix (any weight format) and the region its bytes are read from (for
 * llm_stats.bytes). */
typedef struct llm_mat {
    llm_wmat w;
    llm_region region;
} llm_mat;

typedef struct llm_layer_weights {
    const float *attn_norm;  /* [dim] */
    llm_mat qkv;             /* [dim + 2*kv_dim, dim]: q rows, k rows, v rows */
    llm_mat attn_proj;       /* [dim, dim] */
    const float *ffn_norm;   /* [dim] */
    llm_mat gate, up;        /* [ffn, dim] */
    llm_mat down;            /* [dim, ffn] */
    llm_mat ple_gate;        /* [ple_dim, dim]    (PLE only: esp32-ai) */
    llm_mat ple_proj;        /* [dim, ple_dim]    (PLE only) */
    const float *ple_norm;   /* [dim]             (PLE only) */
} llm_layer_weights;

typedef struct llm_weights {
    const float *rope;            /* [seq_len][head_dim]: cos[head_dim/2] | sin, in the image */
    llm_wmat embed;               /* [vocab_rows, dim], read in place */
    /* PLE only (esp32-ai; zeroed without it): */
    llm_rows ple_rows;            /* [vocab_rows, n_layers*ple_dim], read in place */
    llm_mat ple_model_proj;       /* [n_layers*ple_dim, dim] */
    const float *ple_proj_norm;   /* [ple_dim], shared by the n_layers slices */
    llm_layer_weights *layers;    /* [n_layers] */
    const float *out_norm;        /* [dim] */
    llm_head head;                /* [vocab_out, dim] in tile order, + certificate */
    llm_drafts drafts;            /* the n-gram drafter's tables, read in place */
    llm_region norms_region;
} llm_weights;

/* A quantized matvec input (llm_quantize_act): q has cols rounded up to 32. */
typedef struct llm_act {
    int8_t *q;
    float scale;
} llm_act;

/* What the int8 and fp32 matrices read of a matvec input (llm_run_state.src,
 * beside llm_col so that llm_col keeps its power-of-two size): the floats
 * x[0..n), which stay unchanged until the last matvec that reads them, and
 * the int8-in-groups form made from them when an int8 matrix first asks
 * (act_in in engine.c). q8 holds n rounded up to 32. */
typedef struct llm_src {
    const float *x;
    int8_t *q8;
    float *q8_scale;   /* [n rounded up to 32, / 32] */
    float *own;        /* an fp32 head's input only: [dim] its own copy of x
                        * (the column's buffers move on before llm_logits()) */
    uint32_t n;
    uint32_t q8_group; /* q8, q8_scale hold x in groups of this; 0: none */
} llm_src;

/* Positions one pass can carry: several prompt tokens of a prefill, or the
 * drafted tokens speculative decoding verifies (llm_verify). */
#define LLM_BATCH_MAX LLM_MATVEC_MAX_COLS

/* One position's working buffers within a pass (llm_run_state.col[c]). */
typedef struct llm_col {
    float *x;        /* [dim] residual stream */
    float *xb;       /* [dim] normed input of a branch */
    float *xb2;      /* [dim] output of a branch */
    float *qkv;      /* [dim + 2*kv_dim] this position's q | k | v */
    float *att;      /* [dim] attention output, heads side by side */
    float *hb, *hb2; /* [max(dim, ffn, ple_dim)] FFN / PLE hidden */
    float *ple;      /* [n_layers*ple_dim] this token's PLE inputs */
    float *trow;     /* [n_layers*ple_dim] this token's PLE table row */
    float *scores;   /* [n_heads][seq_len] attention scores */
    float *att_max, *att_den; /* [n_heads] softmax max and denominator */
    llm_act act;     /* [widest rounded to 32] input of the next matvec */
    llm_act head_in; /* [cols_padded] input of this position's head evaluation */
} llm_col;

/* Fast mode's int8 KV cache (attention_fast.c has the layout), laid over
 * the exact cache's float arrays. */
typedef struct llm_fast_kv {
    int8_t *kq;    /* [n_layers][n_kv_heads][seq_len][dhp] K rows, int8 */
    int8_t *vt;    /* [n_layers][n_kv_heads][head_dim][sp] V, transposed, int8 */
    float *ks, *vs; /* [n_layers][n_kv_heads][seq_len] their scales */
    int8_t *qq;    /* [LLM_BATCH_MAX][n_heads][dhp] the quantized queries */
    int8_t *uq;    /* [LLM_BATCH_MAX][n_heads][sp] the quantized weights */
    int32_t *dots; /* [LLM_BATCH_MAX][n_heads][seq_len] integer scores */
    uint32_t dhp, sp; /* head_dim, seq_len rounded up to 16 */
} llm_fast_kv;

typedef struct llm_run_state {
    /* col[0] in internal SRAM (every token uses it), col[1..n_cols) in PSRAM */
    llm_col col[LLM_BATCH_MAX];
    /* src[c][0]: col[c].act's floats and int8-in-groups form, src[c][1]:
     * col[c].head_in's (int8 and fp32 matrices only) */
    llm_src src[LLM_BATCH_MAX][2];
    uint32_t n_cols;
    /* the KV cache (engine_open.c place_kv_cache), arrays on 64-byte lines;
     * row = layer * seq_len + position:
     * kv_k[row]: [kv_dim] K as floats after RoPE, or (K not wide) as its
     *   exact integer dots before RoPE, int16 in the row's first half
     * kv_v[row]: [v_stride] int16: V's exact integer dots, or (V wide) V as
     *   kv_dim floats when v_stride is 2 kv_dim (some V row can be wide:
     *   llm_open's v_can_widen; or no dots)
     * kv_v_floats[row]: [kv_dim] V as floats where v_stride is kv_dim
     *   (plain mode only: NULL until it is first on)
     * kv_scale[row]: the position's activation scale, the dots' xscale
     * kv_wide[row]: LLM_K_WIDE | LLM_V_WIDE, the rows held as floats (dots
     *   wider than int16; K unless llm_set_k_dots; both in plain mode and
     *   without dots) */
    float *kv_k;
    int16_t *kv_v;
    uint32_t v_stride;
    float *kv_v_floats;
    float *kv_scale;
    uint8_t *kv_wide;
    /* [seq_len + 1] the sampler's stream once position p was decoded (after
     * the draws of the head evaluation there; inside a prompt, no draws) */
    llm_rng *rng_at;
    llm_fast_kv fast;   /* fast mode only */
    float *ones;        /* [dim] 1.0f: scales that make the kernel return dots */
    /* [n_heads][4][head_dim] ks rebuilt from dots: a call of attention over
     * heads [h0, h1) uses h0's four rows (the calls' ranges never overlap;
     * here, not on the stack: the board's worker task has 4 KiB). NULL until
     * llm_set_k_dots first turns K as dots on (no row is dots before). */
    float *k_rebuilt;
    float *logits;   /* [vocab_out] dense route and llm_logits() only */
    llm_head_scratch head; /* bounds, heap, one wave of values */
    llm_candidates cand;   /* the sampler's k best of the last evaluation */
    /* a verify pass's candidate lists and the scan's scratch (PSRAM; NULL
     * without the batch buffers) */
    llm_candidates *cands;  /* [LLM_BATCH_MAX] */
    void *many;             /* LLM_HEAD_MANY_SCRATCH(n_tiles) bytes */
} llm_run_state;

struct llm_engine {
    llm_port port;
    llm_image_info image;
    llm_config cfg;
    llm_weights w;
    llm_run_state s;
    llm_region kv_region, logits_region;
    int kv_dots; /* K and V cached as int16 dots (qkv rows are one int4 scale group) */
    int core_q4; /* some layer (or PLE) matrix is int4: quantize() makes q at once */

    /* constants of the forward pass, computed once */
    float inv_sqrt_dim, sqrt_ple_dim, inv_sqrt_head_dim;

    /* state */
    uint32_t pos;
    int have_head;   /* col[head_col].head_in holds the last evaluation */
    uint32_t head_col;
    /* the last pass's evaluations: column head_col0 + c proposed the token of
     * position head_pos0 + c, c < head_n (what rewind keeps for logits()) */
    uint32_t head_pos0, head_col0, head_n;
    int have_logits; /* s.logits holds that evaluation's logits */
    int plain;
    int fast;        /* attention over the int8 KV cache (lossy, opt-in) */
    int k_dots;      /* K stored as dots from the next token on (llm_set_k_dots) */
    int preload;     /* cache preload hints on (llm_set_preload) */
    int (*interrupt_poll)(void *ctx); /* llm_set_interrupt */
    void *interrupt_ctx;
    llm_sampler_options sampler;
    llm_rng rng;
    llm_stats stats;

    /* what went where, and what to free */
    llm_placement *placements;
    void **owned;
    uint32_t n_placements, cap_placements;
    uint64_t spilled_bytes; /* weights meant for RAM, read in place instead */
    /* llm_plan_open's dry run: every block counted against `left` by the
     * port's rule, none allocated (place() hands out LLM_DRY_BLOCK, which
     * nothing writes) */
    int dry;
    llm_memory left;
};

/* kv_wide's bits */
#define LLM_K_WIDE 1u
#define LLM_V_WIDE 2u

/* Fast mode's attention (attention_fast.c): store position p's k and v of
 * layer l; attention of heads [h0, h1) for the pass's m positions; bytes
 * read for `positions` cached positions. */
void llm_fast_store_kv(llm_engine *e, uint32_t l, uint32_t p, const float *k, const float *v);
void llm_fast_attention_heads(llm_engine *e, uint32_t l, uint32_t pos, uint32_t m, uint32_t h0,
                              uint32_t h1);
uint64_t llm_fast_kv_bytes(const llm_engine *e, uint32_t positions);
/* The bytes fast mode's arrays take for config c (they lie over the exact
 * cache, which llm_open makes at least this large). */
uint64_t llm_fast_kv_need(const llm_config *c);

/* The status every successful call leaves in *err. */
static inline llm_status llm_engine_ok(llm_error *err) {
    if (err != NULL) {
        err->status = LLM_OK;
        err->message[0] = 0;
    }
    return LLM_OK;
}

#endif
