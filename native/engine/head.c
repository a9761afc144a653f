/*
 * The output head and its certificate (head.h).
 *
 * Why this is exact: the certificate
 * ---------------------------------
 * Notation for one evaluation: xq[j] the int8 input (padded columns 0), xs the
 * input scale (llm_quantize_act), row r with codes c_rj and scale s_r (one
 * group: the head has cols <= group), w_rj = (c_rj - 8) * s_r its weights.
 * The dense head computes, for every row (kernels.h, llm_matvec_q4):
 *     g_r = sum_j (c_rj - 8) * xq[j]          exact int32
 *     a_r = fl(0 + fl((float)g_r * s_r))      (float)g_r exact (|g_r| < 2^24)
 *     v_r = fl(a_r * xs)                      the logit
 * where fl() is round-to-nearest-even. The sampler then wants the k best
 * pairs (v_r, id_r) under the total order "larger value first, lower id on
 * ties" (k = 1 for greedy; sampler.h).
 *
 * Tile t holds rows R_t (consecutive in the staged order) and a box: int8
 * mid[j], half[j] >= 0 and a power of two sigma_t with, for r in R_t,
 *     (mid[j] - half[j]) * sigma_t <= w_rj <= (mid[j] + half[j]) * sigma_t.
 * The converter builds the boxes; llm_open re-checks every weight against
 * them (llm_head_check_boxes). That check is exact: the loader holds every
 * scale to an fp16 value, so (code - 8) * s_r has at most 15 significant bits,
 * and sigma_t is a power of two, so (mid +- half) * sigma_t is exact too. A
 * wrong converter therefore cannot make this engine wrong, only rejected.
 *
 * Claim 1 (the bound). With A_t = sum_j mid[j]*xq[j] and
 * B_t = sum_j half[j]*|xq[j]| (integers; |mid| <= 128, half <= 127, |xq| <= 127
 * and cols_padded <= 512 give |A_t + B_t| <= 255*127*512 = 16,581,120 < 2^24,
 * so (float)(A_t + B_t) is exact), put
 *     U_t = fl((float)(A_t + B_t) * sigma_t),    b_t = fl(U_t * xs).
 * Then v_r <= b_t for every r in R_t.
 * Proof. Write w_rj = (mid[j] + d_rj) * sigma_t with |d_rj| <= half[j]. In
 * exact arithmetic g_r * s_r = sum_j w_rj * xq[j]
 *   = sigma_t * (A_t + sum_j d_rj * xq[j]) <= sigma_t * (A_t + B_t).
 * Rounding to nearest is monotone (x <= y implies fl(x) <= fl(y), with
 * overflow to +-inf included), so fl(g_r * s_r) <= fl(sigma_t * (A_t+B_t)) = U_t
 * (a float multiply rounds the exact product once). Adding 0 changes no value
 * (-0 becomes +0, which compares equal), so a_r <= U_t. xs > 0 (xs >=
 * 1e-8/127), so multiplying by it is monotone too: v_r = fl(a_r * xs) <=
 * fl(U_t * xs) = b_t. No slack is needed: every step is an exact integer or
 * one monotone rounding, unlike a bound computed in floats (upstream's
 * pruned head adds a 1e-6 relative slack for that reason).
 *
 * Claim 2 (no NaN is skipped). If xs is finite, no v_r is NaN.
 * Proof. g_r and s_r are finite (the loader rejects NaN/Inf scales), so their
 * product is finite or +-inf, never NaN; a_r likewise. NaN would need 0*inf or
 * inf-inf: a_r * xs with xs finite and > 0 is neither. (With several groups
 * per row, a_r sums several products and inf - inf can appear: so one group
 * is a precondition.) When xs is not finite (the final hidden state held an
 * inf) the engine takes the dense route, whose NaN check reports it as before.
 *
 * Claim 3 (skipping is safe). Let F be the value of the k-th best pair found
 * so far, or -inf while fewer than k are known (llm_candidates_floor). If
 * b_t < F, no row of tile t belongs to the final k best.
 * Proof. Every r in R_t has v_r <= b_t < F, so (v_r, id_r) is strictly worse
 * than k pairs already found, whatever its id; F never decreases as more rows
 * are offered. The test is strict: a row equal to F with a lower id would
 * enter the list, and b_t = F does not exclude that.
 *
 * Hence: visiting tiles in any order, scoring each not-skipped tile's rows
 * with the same kernel as the dense head, and offering them to the
 * candidate list (which keeps the k best under the total order, whatever the
 * offer order) ends with exactly the k pairs the dense head's selection
 * yields, with the same value bits. Greedy takes the first; top-k sampling
 * sorts the k ids ascending and draws one Gumbel value per candidate in that
 * order (sampler.c), so the noise a candidate receives depends only on the k
 * best set, never on which tiles were scanned or in what order, and the rng
 * advances by exactly k draws as on the dense route. "Lowest id wins a tie"
 * survives because ties are resolved by the total order, not by scan order.
 *
 * Order of visits (speed only): tiles by descending b_t from a binary max-heap,
 * so the first tile scored is the one most likely to hold the winner and F
 * rises fast. That tile is scored inline; its floor F0 drops every tile whose
 * bound is below it, and the rest, by descending bound, go to two lanes with
 * one hand-off (one lane per core; alternate ranks): each lane keeps its own
 * candidate list and skips by its own floor or F0, whichever is higher, and
 * stops at its first tile below that (every later one is lower still). F0 is
 * the k-th best of rows in the main list, so claim 3 holds for it in either
 * lane; merging the lanes' lists gives the k best of all (the order is total).
 * A lane never reads the other's floor while it runs, so the rows scored do
 * not depend on timing: every port scores the same rows.
 */
#include "head.h"

#include <string.h>

#include "align_up.h"
#include "f32_bits.h"
#include "hot.h"
#include "llm_error.h"

static uint32_t tile_rows_or_chunk(const llm_head *h) {
    /* without tiles, the dense route still works in chunks of this many rows */
    return h->n_tiles ? h->tile_rows : 128u;
}

/* The values buffer: the dense route's chunks of a wave; the certified
 * route's two lanes use its start (a tile's values each), the second lane's
 * candidate list and the tile order after that, so it is sized for both. */
static uint32_t values_bytes(const llm_head *h) {
    const uint32_t wave = llm_align_up(4u * LLM_HEAD_WAVE_TILES * tile_rows_or_chunk(h), 16u);
    const uint32_t lanes = llm_align_up(4u * 2u * tile_rows_or_chunk(h), 16u) +
                           llm_align_up(sizeof(llm_candidates), 16u) +
                           llm_align_up(2u * h->n_tiles, 16u);
    return wave > lanes ? wave : lanes;
}

uint32_t llm_head_scratch_bytes(const llm_head *h) {
    return (uint32_t)(llm_align_up(2u * h->cols_padded, 16u) +
                      llm_align_up(4u * h->n_tiles, 16u) * 2u + llm_align_up(2u * h->n_tiles, 16u) +
                      values_bytes(h));
}

void llm_head_scratch_init(llm_head_scratch *s, const llm_head *h, void *mem) {
    uint8_t *p = mem;
    s->xcat = (int8_t *)p;
    p += llm_align_up(2u * h->cols_padded, 16u);
    s->ibound = (int32_t *)(void *)p;
    p += llm_align_up(4u * h->n_tiles, 16u);
    s->bound = (float *)(void *)p;
    p += llm_align_up(4u * h->n_tiles, 16u);
    s->heap = (uint16_t *)(void *)p;
    p += llm_align_up(2u * h->n_tiles, 16u);
    s->wave_y = (float *)(void *)p;
    s->wave_rows = LLM_HEAD_WAVE_TILES * tile_rows_or_chunk(h);
    p += llm_align_up(4u * 2u * tile_rows_or_chunk(h), 16u);
    s->lane1 = (llm_candidates *)(void *)p;
    p += llm_align_up(sizeof(llm_candidates), 16u);
    s->order = (uint16_t *)(void *)p;
}

int LLM_HOT llm_head_certifiable(const llm_head *h, float xscale) {
    /* xscale - xscale is 0 for finite values, NaN for inf and NaN */
    return h->n_tiles > 0 && h->w.n_groups == 1u && xscale - xscale == 0.0f;
}

/* ---- the staged rows as the kernel reads them ---------------------------- */

/* Rows of the `count` left of a range the kernel takes in its next call:
 * all of them with f32 scales, LLM_HEAD_SCALE_CHUNK at most with fp16 ones. */
static uint32_t LLM_HOT call_rows(const llm_head *h, uint32_t count) {
    return h->scales16 != NULL && count > LLM_HEAD_SCALE_CHUNK ? LLM_HEAD_SCALE_CHUNK : count;
}

/* Staged rows [first, first + n) as an int4 matrix for the kernel. With fp16
 * scales (n <= LLM_HEAD_SCALE_CHUNK) each is widened into buf, the f32 the
 * image holds bit for bit (llm_f16_to_f32_bits is exact on every finite fp16,
 * and the staged fp16 is that f32's own value: engine_open.c), so the kernel
 * is called exactly as on the f32 rows and every value is the same bits. */
static llm_q4 LLM_HOT staged_rows(const llm_head *h, uint32_t first, uint32_t n, float *buf) {
    llm_q4 q = llm_wmat_q4(&h->w);
    q.codes += (size_t)first * q.row_bytes;
    q.rows = n;
    if (h->scales16 == NULL) {
        q.scales += (size_t)first * q.n_groups;
        return q;
    }
    const uint16_t *s16 = h->scales16 + first;
    /* every scale as a positive normal (a trained head's), without a branch:
     * the largest h - 0x0400 says afterwards whether they all were one ... */
    uint32_t worst = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t h16 = s16[i], d = h16 - 0x0400u;
        worst = d > worst ? d : worst;
        buf[i] = llm_f32_from_bits((h16 << 13) + (112u << 23));
    }
    /* ... else all again, each by its own case (zero, subnormal, negative) */
    if (worst >= 0x7800u)
        for (uint32_t i = 0; i < n; i++) buf[i] = llm_f32_from_bits(llm_f16_to_f32_bits(s16[i]));
    q.scales = buf;
    return q;
}

/* ---- one wave: rows of several row ranges, split across cores ----------- */

typedef struct wave_job {
    const llm_head *h;
    const int8_t *xq;
    float xscale;
    float *y;              /* y + k*stride: range k's values */
    uint32_t stride;
    const uint32_t *first; /* range k = staged rows [first[k], first[k] + count[k]) */
    const uint32_t *count;
} wave_job;

static void LLM_HOT wave_ranges(void *arg, uint32_t k0, uint32_t k1) {
    const wave_job *j = arg;
    float widened[LLM_HEAD_SCALE_CHUNK];
    for (uint32_t k = k0; k < k1; k++) {
        /* views of the range's rows, one call each: the kernel writes
         * y[0..count) (each row on its own: kernels.h, so the same bits in
         * one call or several) */
        float *y = j->y + (size_t)k * j->stride;
        for (uint32_t r = 0; r < j->count[k];) {
            const uint32_t n = call_rows(j->h, j->count[k] - r);
            const llm_q4 part = staged_rows(j->h, j->first[k] + r, n, widened);
            llm_matvec_q4(&part, j->xq, j->xscale, y + r, 0, n);
            r += n;
        }
    }
}

static void LLM_HOT run_wave(const llm_splitter *sp, wave_job *job, uint32_t n, llm_head_work *work) {
    if (sp != NULL && sp->split != NULL && n > 1u) {
        sp->split(sp->ctx, wave_ranges, job, n);
        work->handoffs++;
    } else {
        wave_ranges(job, 0, n);
    }
    work->waves++;
}

static uint32_t LLM_HOT id_of(const llm_head *h, uint32_t row) { return h->ids ? h->ids[row] : row; }

/* An int8 or fp32 head: every row through wmat.c in one call on this core
 * (no certificate, no waves; not LLM_HOT: an int4 image never comes here). */
static __attribute__((noinline)) void dense_other(const llm_head *h, const llm_vin *in,
                                                  float *logits, llm_head_work *work) {
    memset(work, 0, sizeof *work);
    llm_wmat_matvec(&h->w, &in, 1u, &logits, 0, h->w.rows);
    work->rows = work->rows_read = work->ids = h->w.rows;
    work->waves = 1;
}

float llm_head_row(const llm_head *h, const llm_vin *in, uint32_t id) {
    const llm_wmat row = llm_wmat_rows(&h->by_id, id, 1u);
    float value = 0.0f, *y = &value;
    llm_wmat_matvec(&row, &in, 1u, &y, 0, 1u);
    return value;
}

void llm_head_dense(const llm_head *h, llm_head_scratch *s, const llm_vin *in, float *logits,
                    const llm_splitter *sp, llm_head_work *work) {
    if (h->w.kind != LLM_IMAGE_KIND_Q4) {
        dense_other(h, in, logits, work);
        return;
    }
    const uint32_t chunk = tile_rows_or_chunk(h);
    uint32_t first[LLM_HEAD_WAVE_TILES], count[LLM_HEAD_WAVE_TILES];
    wave_job job = {h, in->q, in->scale, s->wave_y, chunk, first, count};
    memset(work, 0, sizeof *work);
    for (uint32_t r0 = 0; r0 < h->w.rows;) {
        uint32_t n = 0, r = r0;
        for (; n < LLM_HEAD_WAVE_TILES && r < h->w.rows; n++) {
            first[n] = r;
            count[n] = h->w.rows - r < chunk ? h->w.rows - r : chunk;
            r += count[n];
        }
        run_wave(sp, &job, n, work);
        for (uint32_t k = 0; k < n; k++)
            for (uint32_t i = 0; i < count[k]; i++)
                logits[id_of(h, first[k] + i)] = s->wave_y[(size_t)k * chunk + i];
        r0 = r;
    }
    work->rows = work->rows_read = work->ids = h->w.rows;
}

/* ---- tiles in two lanes: several positions in one scan, or one position's
 * tiles after its first ---------------------------------------------------- */

/* The many-positions scan runs in two lanes, one per core: the tiles in
 * the order of their key (the largest of their m bounds), lane 0 taking
 * ranks 0, 2, 4, ... and lane 1 ranks 1, 3, 5, ..., each with its own
 * candidate lists and its own floors. A lane skips a tile only when its
 * bound for c is strictly below that lane's k-th best for c, so whatever a
 * lane skips is beaten by k rows it kept (claim 3 again); merging the two
 * lanes' lists (the candidates' order is total: value, then lowest id)
 * gives exactly the k best of every position. Two lanes everywhere, not
 * only where there is a second core, so every port scores the same rows. */
typedef struct many_job {
    const llm_head *h;
    const int8_t *const *xq;
    const float *xscale;
    uint32_t m, T;
    const float *bound;   /* [m][stride] */
    size_t stride;
    const float *key;     /* [tiles] */
    const uint16_t *order; /* [T] the tiles to visit, by key, largest first */
    const float *seed;    /* [m] a floor both lanes start from, or NULL (-inf) */
    llm_candidates *const *cand[2];
    float *ys[2];         /* [m][tile_rows] per lane */
    llm_head_work work[2];
    int32_t nan_id[2];    /* a NaN logit's id, -1: none */
    const llm_splitter *sp; /* its preload hint (NULL: none) */
} many_job;

/* Ask the port to stage tile t's codes while this lane scores the one before
 * (llm_set_preload): a hint, the scores are the same either way. */
static void LLM_HOT preload_tile(const many_job *j, uint32_t t, llm_head_work *work) {
    const llm_head *h = j->h;
    if (j->sp == NULL || j->sp->preload == NULL || h->rows_region == LLM_REGION_FAST) return;
    const uint32_t first = t * h->tile_rows;
    const uint32_t count = h->w.rows - first < h->tile_rows ? h->w.rows - first : h->tile_rows;
    size_t bytes = (size_t)count * h->w.row_bytes;
    if (bytes > LLM_PRELOAD_MAX_BYTES) bytes = LLM_PRELOAD_MAX_BYTES;
    j->sp->preload(j->sp->ctx, h->w.data + (size_t)first * h->w.row_bytes, bytes);
    work->preloads++;
    work->preload_bytes += bytes;
}

/* Position c's floor in a lane: its list's, or the seed when that is higher. */
static float LLM_HOT lane_floor(const many_job *j, llm_candidates *const *cand, uint32_t c) {
    const float f = llm_candidates_floor(cand[c]);
    return j->seed != NULL && j->seed[c] > f ? j->seed[c] : f;
}

static void LLM_HOT many_lane(void *arg, uint32_t l0, uint32_t l1) {
    many_job *j = arg;
    const llm_head *h = j->h;
    for (uint32_t lane = l0; lane < l1; lane++) {
        llm_candidates *const *cand = j->cand[lane];
        llm_head_work *work = &j->work[lane];
        for (uint32_t r = lane; r < j->T; r += 2u) {
            const uint16_t t = j->order[r];
            float lowest = lane_floor(j, cand, 0);
            for (uint32_t c = 1; c < j->m; c++) {
                float f = lane_floor(j, cand, c);
                if (f < lowest) lowest = f;
            }
            if (j->key[t] < lowest) break; /* keys only fall from here on */
            const int8_t *xs[LLM_HEAD_MANY_MAX];
            float sc[LLM_HEAD_MANY_MAX], *ys[LLM_HEAD_MANY_MAX];
            uint32_t who[LLM_HEAD_MANY_MAX], n = 0;
            for (uint32_t c = 0; c < j->m; c++) {
                if (j->bound[(size_t)c * j->stride + t] < lane_floor(j, cand, c)) continue;
                xs[n] = j->xq[c];
                sc[n] = j->xscale[c];
                ys[n] = j->ys[lane] + (size_t)n * h->tile_rows;
                who[n++] = c;
            }
            if (n == 0) continue;
            if (r + 2u < j->T) preload_tile(j, j->order[r + 2u], work); /* this lane's next */
            /* the tile's rows, read once, scored for every position that needs them */
            const uint32_t first = (uint32_t)t * h->tile_rows;
            const uint32_t count =
                h->w.rows - first < h->tile_rows ? h->w.rows - first : h->tile_rows;
            /* certified heads are int4; one call a tile unless its scales
             * are fp16 and it is longer than the widening buffer */
            float widened[LLM_HEAD_SCALE_CHUNK];
            for (uint32_t r0 = 0; r0 < count;) {
                const uint32_t nr = call_rows(h, count - r0);
                const llm_q4 part = staged_rows(h, first + r0, nr, widened);
                float *yr[LLM_HEAD_MANY_MAX];
                for (uint32_t k = 0; k < n; k++) yr[k] = ys[k] + r0;
                if (n == 1u)
                    llm_matvec_q4(&part, xs[0], sc[0], yr[0], 0, nr);
                else
                    llm_matvec_q4_cols(&part, xs, sc, n, yr, 0, nr);
                r0 += nr;
            }
            /* row by row, every position: a value below the lane's floor cannot
             * enter (claim 3 per row), so its id is never read; a floor only
             * changes when its list takes a row */
            float fl[LLM_HEAD_MANY_MAX];
            for (uint32_t k = 0; k < n; k++) fl[k] = lane_floor(j, cand, who[k]);
            for (uint32_t i = 0; i < count; i++) {
                uint32_t id = UINT32_MAX; /* not read yet (ids are 16-bit) */
                for (uint32_t k = 0; k < n; k++) {
                    const float v = ys[k][i];
                    if (v != v) { /* unreachable by claim 2; kept as the dense route's check */
                        j->nan_id[lane] = (int32_t)id_of(h, first + i);
                        return;
                    }
                    if (v < fl[k]) continue;
                    if (id == UINT32_MAX) {
                        id = id_of(h, first + i);
                        work->ids++;
                    }
                    llm_candidates_offer(cand[who[k]], v, id);
                    fl[k] = lane_floor(j, cand, who[k]);
                }
            }
            work->rows += count * n; /* rows scored, counted per position */
            work->tiles++;
            work->rows_read += count;
        }
    }
}

/* Both lanes (on two cores when `split`, else one after the other), then
 * their work summed and lane 1's lists offered into lane 0's. */
static llm_status LLM_HOT run_lanes(const llm_splitter *sp, int split, many_job *job,
                                    llm_head_work *work, llm_error *err) {
    job->sp = sp;
    if (split && sp != NULL && sp->split != NULL) {
        sp->split(sp->ctx, many_lane, job, 2u);
        work->handoffs++;
    } else {
        many_lane(job, 0, 2u);
    }
    for (uint32_t lane = 0; lane < 2u; lane++) {
        if (job->nan_id[lane] >= 0)
            return llm_fail(err, LLM_E_ARG, "logit %ld is NaN", (long)job->nan_id[lane]);
        work->rows += job->work[lane].rows;
        work->tiles += job->work[lane].tiles;
        work->rows_read += job->work[lane].rows_read;
        work->ids += job->work[lane].ids;
        work->preloads += job->work[lane].preloads;
        work->preload_bytes += job->work[lane].preload_bytes;
    }
    for (uint32_t c = 0; c < job->m; c++) {
        const llm_candidates *from = job->cand[1][c];
        for (uint32_t i = 0; i < from->count; i++)
            llm_candidates_offer(job->cand[0][c], from->value[i], from->id[i]);
    }
    return LLM_OK;
}

/* ---- the certified route ------------------------------------------------ */

/* Max-heap of tile ids on bound[]; ties keep whatever order the sift gives,
 * which only changes the visiting order, never the result (claim 3). */
static void LLM_HOT sift_down(uint16_t *heap, uint32_t n, uint32_t i, const float *bound) {
    for (;;) {
        uint32_t l = 2u * i + 1u, best = i;
        if (l < n && bound[heap[l]] > bound[heap[best]]) best = l;
        if (l + 1u < n && bound[heap[l + 1u]] > bound[heap[best]]) best = l + 1u;
        if (best == i) return;
        uint16_t tmp = heap[i];
        heap[i] = heap[best];
        heap[best] = tmp;
        i = best;
    }
}

static uint16_t LLM_HOT heap_pop(uint16_t *heap, uint32_t *n, const float *bound) {
    uint16_t top = heap[0];
    heap[0] = heap[--*n];
    sift_down(heap, *n, 0, bound);
    return top;
}

llm_status LLM_HOT llm_head_certify(const llm_head *h, llm_head_scratch *s, const int8_t *xq,
                            float xscale, llm_candidates *cand, const llm_splitter *sp,
                            llm_head_work *work, llm_error *err) {
    const uint32_t cp = h->cols_padded, T = h->n_tiles;
    memset(work, 0, sizeof *work);

    /* claim 1: every tile's bound from one int8 matrix x vector */
    memcpy(s->xcat, xq, cp);
    for (uint32_t j = 0; j < cp; j++) s->xcat[cp + j] = (int8_t)(xq[j] < 0 ? -xq[j] : xq[j]);
    llm_matvec_s8(h->boxes, T, 2u * cp, s->xcat, s->ibound);
    for (uint32_t t = 0; t < T; t++) {
        s->bound[t] = ((float)s->ibound[t] * h->tile_scale[t]) * xscale;
        s->heap[t] = (uint16_t)t;
    }
    uint32_t n_heap = T;
    for (uint32_t i = n_heap / 2u; i-- > 0;) sift_down(s->heap, n_heap, i, s->bound);

    /* the first tile, inline: the k best of its rows set the floor F0 */
    const uint16_t t0 = heap_pop(s->heap, &n_heap, s->bound);
    uint32_t first = (uint32_t)t0 * h->tile_rows;
    uint32_t count = h->w.rows - first < h->tile_rows ? h->w.rows - first : h->tile_rows;
    wave_job job = {h, xq, xscale, s->wave_y, h->tile_rows, &first, &count};
    run_wave(NULL, &job, 1u, work);
    float floor = llm_candidates_floor(cand);
    for (uint32_t i = 0; i < count; i++) {
        const float v = s->wave_y[i];
        if (v != v) /* unreachable by claim 2; the dense route's check */
            return llm_fail(err, LLM_E_ARG, "logit %lu is NaN", (unsigned long)id_of(h, first + i));
        if (v < floor) continue; /* cannot enter (claim 3 per row): its id is never read */
        llm_candidates_offer(cand, v, id_of(h, first + i));
        work->ids++;
        floor = llm_candidates_floor(cand);
    }
    work->rows = work->rows_read = count;
    work->tiles = 1;

    /* claim 3: the tiles still at or above F0, largest bound first, in two lanes */
    const float f0 = llm_candidates_floor(cand);
    uint32_t n = 0;
    while (n_heap > 0 && !(s->bound[s->heap[0]] < f0))
        s->order[n++] = heap_pop(s->heap, &n_heap, s->bound);
    if (n == 0) return LLM_OK;
    llm_candidates_init(s->lane1, cand->k);
    llm_candidates *c0[1] = {cand}, *c1[1] = {s->lane1};
    const int8_t *xqs[1] = {xq};
    many_job lanes = {h, xqs, &xscale, 1u, n, s->bound, 0u, s->bound, s->order, &f0, {c0, c1},
                      {s->wave_y, s->wave_y + h->tile_rows}, {{0}, {0}}, {-1, -1}, NULL};
    work->waves++;
    return run_lanes(sp, n > 1u /* one tile: lane 1 has none */, &lanes, work, err);
}

llm_status llm_head_certify_many(const llm_head *h, llm_head_scratch *s, void *mem,
                                 const llm_splitter *sp,
                                 const int8_t *const *xq, const float *xscale, uint32_t m,
                                 llm_candidates *const *cand, llm_head_work *work,
                                 llm_error *err) {
    const uint32_t cp = h->cols_padded, T = h->n_tiles;
    memset(work, 0, sizeof *work);
    if (m == 0 || m > LLM_HEAD_MANY_MAX)
        return llm_fail(err, LLM_E_ARG, "llm_head_certify_many: %lu positions",
                        (unsigned long)m);
    /* scratch: ibound[m][T], bound[m][T], key[T], heap[T], order[T], lane 1's
     * candidate lists [m] and values [m][tile_rows] */
    const size_t stride = llm_align_up(4u * (size_t)T, 16u) / 4u;
    uint8_t *p = mem;
    int32_t *ibound = (int32_t *)(void *)p;
    p += (size_t)LLM_HEAD_MANY_MAX * llm_align_up(4u * (size_t)T, 16u);
    float *bound = (float *)(void *)p;
    p += (size_t)LLM_HEAD_MANY_MAX * llm_align_up(4u * (size_t)T, 16u);
    float *key = (float *)(void *)p;
    p += llm_align_up(4u * (size_t)T, 16u);
    uint16_t *heap = (uint16_t *)(void *)p;
    p += llm_align_up(2u * (size_t)T, 16u);
    uint16_t *order = (uint16_t *)(void *)p;
    p += llm_align_up(2u * (size_t)T, 16u);
    llm_candidates *lane1 = (llm_candidates *)(void *)p;
    p += (size_t)LLM_HEAD_MANY_MAX * llm_align_up(sizeof(llm_candidates), 16u);
    float *ys1 = (float *)(void *)p;

    /* claim 1, position by position */
    for (uint32_t c = 0; c < m; c++) {
        int32_t *ib = ibound + (size_t)c * stride;
        float *b = bound + (size_t)c * stride;
        memcpy(s->xcat, xq[c], cp);
        for (uint32_t j = 0; j < cp; j++)
            s->xcat[cp + j] = (int8_t)(xq[c][j] < 0 ? -xq[c][j] : xq[c][j]);
        llm_matvec_s8(h->boxes, T, 2u * cp, s->xcat, ib);
        for (uint32_t t = 0; t < T; t++) {
            b[t] = ((float)ib[t] * h->tile_scale[t]) * xscale[c];
            if (c == 0 || b[t] > key[t]) key[t] = b[t];
        }
    }
    /* every tile by key, largest first (a heap emptied: ties by tile index) */
    for (uint32_t t = 0; t < T; t++) heap[t] = (uint16_t)t;
    uint32_t n_heap = T;
    for (uint32_t i = n_heap / 2u; i-- > 0;) sift_down(heap, n_heap, i, key);
    for (uint32_t r = 0; r < T; r++) order[r] = heap_pop(heap, &n_heap, key);

    llm_candidates *cand1[LLM_HEAD_MANY_MAX];
    for (uint32_t c = 0; c < m; c++) {
        cand1[c] = &lane1[c];
        llm_candidates_init(cand1[c], cand[c]->k);
    }
    many_job job = {h, xq, xscale, m, T, bound, stride, key, order, NULL, {cand, cand1},
                    {s->wave_y, ys1}, {{0}, {0}}, {-1, -1}, NULL};
    return run_lanes(sp, 1, &job, work, err);
}

/* ---- checks at open ------------------------------------------------------ */

llm_status llm_head_check_order(const llm_tiles *t, uint8_t *seen, llm_error *err) {
    memset(seen, 0, (t->rows + 7u) / 8u);
    for (uint32_t i = 0; i < t->rows; i++) {
        uint32_t id = t->order[i];
        if (id >= t->rows || (seen[id >> 3] >> (id & 7u)) & 1u)
            return llm_fail(err, LLM_E_FORMAT, "head_tiles: order[%lu] = %lu is %s", (unsigned long)i,
                            (unsigned long)id, id >= t->rows ? "out of range" : "a repeat");
        seen[id >> 3] = (uint8_t)(seen[id >> 3] | 1u << (id & 7u));
    }
    return LLM_OK;
}

llm_status llm_head_check_boxes(const llm_q4 *rows, const llm_tiles *t, llm_error *err) {
    const uint32_t cp = t->cols_padded;
    for (uint32_t r = 0; r < t->rows; r++) {
        const uint32_t tile = r / t->tile_rows, id = t->order[r];
        const int8_t *mid = t->boxes + (size_t)tile * 2u * cp, *half = mid + cp;
        const float sigma = t->scales[tile], sc = rows->scales[id];
        const uint8_t *row = rows->codes + (size_t)id * rows->row_bytes;
        for (uint32_t j = 0; j < rows->cols; j++) {
            uint8_t byte = row[16u * (j / 32u) + (j % 16u)];
            int code = (j % 32u) < 16u ? (byte & 0x0F) : (byte >> 4);
            /* all three products exact: a 4-bit integer times an fp16 value
             * (the loader holds scales to that), an 8-bit one times 2^e */
            float w = (float)(code - 8) * sc;
            float lo = (float)(mid[j] - half[j]) * sigma, hi = (float)(mid[j] + half[j]) * sigma;
            if (!(lo <= w && w <= hi))
                return llm_fail(err, LLM_E_FORMAT, "head_tiles: token %lu column %lu (%g) is "
                                "outside tile %lu's box [%g, %g]", (unsigned long)id,
                                (unsigned long)j, (double)w, (unsigned long)tile, (double)lo,
                                (double)hi);
        }
    }
    return LLM_OK;
}
