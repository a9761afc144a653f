/*
 * The output head: logits = head rows . x over vocab_out rows, and the
 * certified head that finds the sampler's candidates while scoring only the
 * rows that could be among them (the proof is at the top of head.c).
 *
 * Two routes, one answer:
 *   llm_head_dense    every row, logits[id] for every id (plain mode, a
 *                     sampler that needs every logit, Model.logits()).
 *   llm_head_certify  the k best (value, id) pairs under (value desc, id asc)
 *                     straight into an llm_candidates list, no logits buffer;
 *                     the rows it skips provably cannot be among them.
 * Both compute each scored row with the same matvec kernel call, so every
 * value they produce is the same bits.
 */
#ifndef LLM_HEAD_H
#define LLM_HEAD_H

#include <stdint.h>

#include "align_up.h"
#include "image.h"
#include "kernels.h"
#include "llm.h"
#include "sampler.h"
#include "wmat.h"

/* Chunks of rows per hand-off on the dense route (plain mode, or a sampler
 * that needs every logit). The certified route scores its first tile inline
 * (it usually sets the floor that prunes most of the rest), then every tile
 * still above that floor in two lanes, one per core, with one hand-off
 * (head.c: "Order of visits"). */
#define LLM_HEAD_WAVE_TILES 8u

/* Rows the certified head widens the fp16 scales of at once (a float each on
 * the stack of the core scoring them), and so rows per kernel call when the
 * scales are fp16: a tile of the release model's 128 is one call. The 512
 * bytes keep the worker's deepest frame where it was: xtensa gcc -O2 gives
 * the lane scan 832 bytes with them, attention on the worker 1,312. */
#define LLM_HEAD_SCALE_CHUNK 128u

/* The head as staged: rows in tile order (row i is token ids[i]). */
typedef struct llm_head {
    llm_wmat w;             /* [rows][row_bytes] codes or values, [rows][n_groups] scales;
                             * only an int4 head has a certificate (image.c). The
                             * copy staged in tile order has w.scales NULL: */
    const uint16_t *scales16; /* [rows] its one scale a row as fp16 bits, the value
                             * the image's f32 holds (the loader checks every int4
                             * scale is an fp16 value), widened back per scored
                             * tile; NULL: w.scales */
    const uint16_t *ids;    /* [rows] token id of staged row i; NULL: row i is id i */
    llm_wmat by_id;         /* the same rows in id order (the image's, when w holds
                             * them in tile order; else w itself): llm_head_row */
    /* the certificate; n_tiles == 0 when there is none */
    const int8_t *boxes;    /* [n_tiles][2*cols_padded]: mid then half */
    const float *tile_scale; /* [n_tiles] sigma_t, powers of two */
    uint32_t tile_rows, n_tiles, cols_padded;
    llm_region rows_region, ids_region, boxes_region;
} llm_head;

/* Scratch the head needs per evaluation; owned by the engine (FAST). */
typedef struct llm_head_scratch {
    int8_t *xcat;     /* [2*cols_padded] xq, then |xq| */
    int32_t *ibound;  /* [n_tiles] integer tile bounds */
    float *bound;     /* [n_tiles] logit bounds */
    uint16_t *heap;   /* [n_tiles] tiles not yet scored, max-heap on bound */
    float *wave_y;    /* [LLM_HEAD_WAVE_TILES * max(tile_rows, 1)] the dense route's
                       * values; the certified route's two lanes use its first
                       * 2 * tile_rows, and lane1 and order lie in the rest */
    llm_candidates *lane1; /* the second lane's candidate list */
    uint16_t *order;  /* [n_tiles] tiles left after the first, by bound, largest first */
    uint32_t wave_rows; /* rows wave_y holds */
} llm_head_scratch;

/* What one evaluation cost, for llm_stats and the cost model. */
typedef struct llm_head_work {
    uint32_t rows;      /* rows scored, summed over the positions evaluated */
    uint32_t rows_read; /* rows fetched from memory (once per tile for all positions) */
    uint32_t ids;       /* token ids read: every row on the dense route; on the
                         * certified one only rows that could enter a list */
    uint32_t tiles, waves, handoffs;
    uint32_t preloads;  /* tiles handed to the splitter's preload hint */
    uint64_t preload_bytes;
} llm_head_work;

/* Runs fn over [0, n) split across cores (the port's parallel_rows), or
 * inline when split is NULL. `preload` (NULL: none) is the port's cache
 * preload hint (llm_set_preload), called with `ctx` for the next tile a lane
 * will score; a hint only, no result depends on it. */
typedef struct llm_splitter {
    void (*split)(void *ctx, llm_rows_fn fn, void *arg, uint32_t n);
    void *ctx;
    void (*preload)(void *ctx, const void *addr, size_t bytes);
} llm_splitter;

/* Bytes one staged row occupies, its scales included (what scoring it reads):
 * codes + 2 with fp16 scales, else llm_wmat_row_cost. */
static inline uint64_t llm_head_row_cost(const llm_head *h) {
    return h->scales16 != NULL ? (uint64_t)h->w.row_bytes + 2u : llm_wmat_row_cost(&h->w);
}

/* Bytes of scratch for a head of this shape (16-byte multiples). */
uint32_t llm_head_scratch_bytes(const llm_head *h);
void llm_head_scratch_init(llm_head_scratch *s, const llm_head *h, void *mem);

/* Whether llm_head_certify may be used for this input: a certificate exists,
 * every row is one group, and xscale is finite (see the proof in head.c). */
int llm_head_certifiable(const llm_head *h, float xscale);

/* logits[id] for every id, in wave_y-sized chunks; `in` in the form the
 * head's kind reads (wmat.h). */
void llm_head_dense(const llm_head *h, llm_head_scratch *s, const llm_vin *in, float *logits,
                    const llm_splitter *sp, llm_head_work *work);

/* The logit of token id `id` (< rows) alone: its row of by_id through the
 * kernel of the head's kind, as llm_wmat_matvec runs it for one row. The
 * same bits llm_head_dense writes to logits[id]: every kernel computes each
 * row on its own (kernels.h), and the staged rows are copies of the image's
 * (their fp16 scales widened back to the image's f32 bits). `in` as for
 * llm_head_dense. */
float llm_head_row(const llm_head *h, const llm_vin *in, uint32_t id);

/* Offer every row that can still matter to `cand` (already initialised with
 * its k). Fails only on a NaN value, which the preconditions rule out. */
llm_status llm_head_certify(const llm_head *h, llm_head_scratch *s, const int8_t *xq,
                            float xscale, llm_candidates *cand, const llm_splitter *sp,
                            llm_head_work *work, llm_error *err);

/* The certified head for m positions at once (speculative verification):
 * what llm_head_certify does for each, in one scan whose tile rows are read
 * once for all of them. Needs LLM_HEAD_MANY_SCRATCH(n_tiles, tile_rows)
 * bytes of 16-byte aligned scratch (`mem`). Tiles are visited by the largest
 * of their m bounds, in two lanes (alternate ranks; through `sp` on two
 * cores, else one after the other); a tile is scored for the positions whose
 * floor in its lane it does not fall below (head.c's claim 3, position by
 * position), and the lanes' lists are merged, so every cand[c] ends with
 * exactly the k best pairs of position c. */
#define LLM_HEAD_MANY_MAX 8u
#define LLM_HEAD_MANY_SCRATCH(n_tiles, tile_rows)                                        \
    ((size_t)(LLM_HEAD_MANY_MAX * llm_align_up((uint64_t)(n_tiles) * 4u, 16u) * 2u +      \
              llm_align_up((uint64_t)(n_tiles) * 4u, 16u) +                             \
              llm_align_up((uint64_t)(n_tiles) * 2u, 16u) * 2u +                         \
              LLM_HEAD_MANY_MAX * llm_align_up(sizeof(llm_candidates), 16u) +            \
              (uint64_t)LLM_HEAD_MANY_MAX * ((tile_rows) > 0 ? (tile_rows) : 1) * 4u))
llm_status llm_head_certify_many(const llm_head *h, llm_head_scratch *s, void *mem,
                                 const llm_splitter *sp,
                                 const int8_t *const *xq, const float *xscale, uint32_t m,
                                 llm_candidates *const *cand, llm_head_work *work,
                                 llm_error *err);

/* Check an image's tile section against the head it describes: the order is
 * a permutation (`seen` is rows/8 rounded up bytes of scratch), and every
 * weight of the head (its rows in id order, as the image holds them) lies in
 * the box of the tile its position in the order puts it in. LLM_E_FORMAT
 * names the first violation. */
llm_status llm_head_check_order(const llm_tiles *t, uint8_t *seen, llm_error *err);
llm_status llm_head_check_boxes(const llm_q4 *rows, const llm_tiles *t, llm_error *err);

#endif
