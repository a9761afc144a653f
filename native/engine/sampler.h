/*
 * Token sampler: greedy argmax or Gumbel-max over the top-k logits, with a
 * PCG32 noise source and the engine's own logf, so a seeded sampled story is
 * the same bits on the host, on the board and in tools/mpllm/reference/sampler.py.
 *
 * PRNG: PCG32 (XSH-RR 64/32).
 *   step:    old = state; state = old * 6364136223846793005 + inc  (mod 2^64)
 *   output:  x = (uint32)(((old >> 18) ^ old) >> 27); rot = old >> 59;
 *            out = (x >> rot) | (x << ((32 - rot) & 31))
 *   seeding: llm_rng_seed(rng, seed): inc = 1442695040888963407 (odd);
 *            state = 0; step once; state += seed; step once.
 * Uniform in (0,1): u = (float)(((r >> 9) << 1) | 1) * 2^-24 for r =
 *   llm_rng_next(): the odd integers 1..2^24-1 times 2^-24, every step exact,
 *   so u is never 0 or 1 and both logs below stay finite.
 * Gumbel noise: g = -llm_logf(-llm_logf(u)), one u per noise value.
 *
 * Selection (llm_sample):
 *   - any NaN logit -> LLM_E_ARG; temperature must be finite and >= 0.
 *   - seed == 0 or temperature == 0: greedy: the largest logit, lowest id on
 *     ties. No random number is drawn.
 *   - otherwise candidates = the k largest logits, ties broken toward the
 *     lower id (k = top_k; top_k == 0 or top_k >= n means every id). For each
 *     candidate in ASCENDING ID order, draw one u (so exactly k draws per
 *     call), v = logits[id] / temperature + g (a float division, then an
 *     add); the winner is the largest v, lowest id on ties.
 *   - 0 < top_k < n with top_k > LLM_SAMPLER_MAX_TOP_K -> LLM_E_ARG (the
 *     candidate list lives in a fixed stack buffer: no allocation).
 * The rng state carries over between calls: a story is one seed, then one
 * llm_sample per token.
 *
 * The selection is split in two so that the certified head (head.c) can feed
 * it without a logits buffer: an llm_candidates list keeps the k best
 * (value, id) pairs in the order (value descending, id ascending), whatever
 * order they are offered in, and llm_sample_candidates draws the noise over
 * it. The k best under that total order are exactly the "k largest logits,
 * ties toward the lower id" above, so both routes choose the same token.
 */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stdint.h>

#include "llm.h"

#define LLM_SAMPLER_MAX_TOP_K 256u

typedef struct llm_rng {
    uint64_t state, inc;
} llm_rng;

void llm_rng_seed(llm_rng *rng, uint64_t seed);
uint32_t llm_rng_next(llm_rng *rng);
/* (0,1) from one llm_rng_next, see above. */
float llm_rng_uniform(llm_rng *rng);
/* -logf(-logf(u)) with one llm_rng_uniform. */
float llm_rng_gumbel(llm_rng *rng);

/* Check options before use (for llm_set_sampler): temperature finite and
 * >= 0, top_k within LLM_SAMPLER_MAX_TOP_K unless it covers all n ids. */
llm_status llm_sampler_check(const llm_sampler_options *opt, uint32_t n, llm_error *err);

/* The k best (value, id) pairs seen so far, best first. */
typedef struct llm_candidates {
    uint32_t k, count;
    float value[LLM_SAMPLER_MAX_TOP_K];
    uint32_t id[LLM_SAMPLER_MAX_TOP_K];
} llm_candidates;

/* k in 1..LLM_SAMPLER_MAX_TOP_K: the number of candidates the options need
 * (1 for greedy), or 0 when they need every logit (top_k covers all n ids:
 * only the dense path can draw that noise, in ascending id order). */
uint32_t llm_sampler_candidates_needed(const llm_sampler_options *opt, uint32_t n);

void llm_candidates_init(llm_candidates *c, uint32_t k);

/* Offer one logit. Not NaN (callers check: a NaN is an error, not a value). */
void llm_candidates_offer(llm_candidates *c, float value, uint32_t id);

/* Every value strictly below this cannot enter the list any more: -inf until
 * the list is full, then its worst value. (A value equal to it can still
 * enter with a lower id, so skipping needs `<`, never `<=`.) */
float llm_candidates_floor(const llm_candidates *c);

/* Choose from a full candidate list: greedy takes the first; otherwise one
 * noise draw per candidate in ascending id order, exactly as llm_sample. */
llm_status llm_sample_candidates(llm_candidates *c, const llm_sampler_options *opt,
                                 llm_rng *rng, int32_t *out, llm_error *err);

/* Pick the next token from logits[0..n) (n >= 1) per the rule above. */
llm_status llm_sample(const float *logits, uint32_t n, const llm_sampler_options *opt,
                      llm_rng *rng, int32_t *out, llm_error *err);

#endif
