/* Sampler; the recipe (constants, draw order, tie rules) is in sampler.h. */
#include "sampler.h"

#include "hot.h"
#include "llm_error.h"
#include "mathf.h"

#define LLM_PCG_MULT 6364136223846793005ull
#define LLM_PCG_INC 1442695040888963407ull

void llm_rng_seed(llm_rng *rng, uint64_t seed) {
    rng->state = 0;
    rng->inc = LLM_PCG_INC;
    (void)llm_rng_next(rng);
    rng->state += seed;
    (void)llm_rng_next(rng);
}

uint32_t LLM_HOT llm_rng_next(llm_rng *rng) {
    uint64_t old = rng->state;
    rng->state = old * LLM_PCG_MULT + rng->inc;
    uint32_t x = (uint32_t)(((old >> 18) ^ old) >> 27);
    uint32_t rot = (uint32_t)(old >> 59);
    return (x >> rot) | (x << ((32u - rot) & 31u));
}

float LLM_HOT llm_rng_uniform(llm_rng *rng) {
    uint32_t r = llm_rng_next(rng);
    return (float)(((r >> 9) << 1) | 1u) * 0x1p-24f;
}

float LLM_HOT llm_rng_gumbel(llm_rng *rng) {
    float u = llm_rng_uniform(rng);
    return -llm_logf(-llm_logf(u));
}

llm_status llm_sampler_check(const llm_sampler_options *opt, uint32_t n, llm_error *err) {
    if (!opt) {
        return llm_fail(err, LLM_E_ARG, "sampler options are NULL");
    }
    float t = opt->temperature;
    /* t != t catches NaN; the second test catches +inf */
    if (t != t || t < 0.0f || t - t != 0.0f) {
        return llm_fail(err, LLM_E_ARG,
                                "sampler temperature must be finite and >= 0, got %g",
                                (double)t);
    }
    if (opt->top_k > LLM_SAMPLER_MAX_TOP_K && opt->top_k < n) {
        return llm_fail(err, LLM_E_ARG,
                                "top_k %lu exceeds the supported %u (use 0 for all %lu ids)",
                                (unsigned long)opt->top_k, LLM_SAMPLER_MAX_TOP_K,
                                (unsigned long)n);
    }
    return LLM_OK;
}

static int greedy(const llm_sampler_options *opt) {
    return opt->seed == 0 || opt->temperature == 0.0f;
}

uint32_t llm_sampler_candidates_needed(const llm_sampler_options *opt, uint32_t n) {
    if (greedy(opt)) return 1;
    if (opt->top_k == 0 || opt->top_k >= n) return 0;
    return opt->top_k;
}

void llm_candidates_init(llm_candidates *c, uint32_t k) {
    c->k = k == 0 ? 1u : (k > LLM_SAMPLER_MAX_TOP_K ? LLM_SAMPLER_MAX_TOP_K : k);
    c->count = 0;
}

/* (va, ia) comes before (vb, ib): larger value, then lower id. */
static int LLM_HOT precedes(float va, uint32_t ia, float vb, uint32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

void LLM_HOT llm_candidates_offer(llm_candidates *c, float value, uint32_t id) {
    uint32_t j;
    if (c->count < c->k) {
        j = c->count++;
    } else if (precedes(value, id, c->value[c->k - 1], c->id[c->k - 1])) {
        j = c->k - 1;
    } else {
        return;
    }
    while (j > 0 && precedes(value, id, c->value[j - 1], c->id[j - 1])) {
        c->value[j] = c->value[j - 1];
        c->id[j] = c->id[j - 1];
        j--;
    }
    c->value[j] = value;
    c->id[j] = id;
}

float LLM_HOT llm_candidates_floor(const llm_candidates *c) {
    return c->count < c->k ? -__builtin_inff() : c->value[c->k - 1];
}

llm_status LLM_HOT llm_sample_candidates(llm_candidates *c, const llm_sampler_options *opt,
                                 llm_rng *rng, int32_t *out, llm_error *err) {
    if (!c || !opt || !out || c->count == 0) {
        return llm_fail(err, LLM_E_ARG, "llm_sample_candidates: no candidates or no output");
    }
    if (greedy(opt)) {
        *out = (int32_t)c->id[0];
        return LLM_OK;
    }
    if (!rng) {
        return llm_fail(err, LLM_E_ARG, "llm_sample: sampling needs an rng");
    }
    /* draw order: ascending id (insertion sort of at most 256 entries) */
    const uint32_t k = c->count;
    for (uint32_t a = 1; a < k; a++) {
        uint32_t id = c->id[a];
        float v = c->value[a];
        uint32_t b = a;
        while (b > 0 && c->id[b - 1] > id) {
            c->id[b] = c->id[b - 1];
            c->value[b] = c->value[b - 1];
            b--;
        }
        c->id[b] = id;
        c->value[b] = v;
    }
    const float temp = opt->temperature;
    uint32_t best = 0;
    float best_v = 0.0f;
    for (uint32_t a = 0; a < k; a++) {
        float v = c->value[a] / temp + llm_rng_gumbel(rng);
        if (a == 0 || v > best_v) {
            best = c->id[a];
            best_v = v;
        }
    }
    *out = (int32_t)best;
    return LLM_OK;
}

llm_status llm_sample(const float *logits, uint32_t n, const llm_sampler_options *opt,
                      llm_rng *rng, int32_t *out, llm_error *err) {
    if (!logits || !out || n == 0 || n > (uint32_t)INT32_MAX) {
        return llm_fail(err, LLM_E_ARG, "llm_sample: no logits or no output");
    }
    llm_status st = llm_sampler_check(opt, n, err);
    if (st != LLM_OK) {
        return st;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (logits[i] != logits[i]) {
            return llm_fail(err, LLM_E_ARG, "logit %lu is NaN", (unsigned long)i);
        }
    }
    const uint32_t k = llm_sampler_candidates_needed(opt, n);
    if (k == 0) {
        /* every id is a candidate: one draw per id, ascending */
        if (!rng) {
            return llm_fail(err, LLM_E_ARG, "llm_sample: sampling needs an rng");
        }
        const float temp = opt->temperature;
        uint32_t best = 0;
        float best_v = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            float v = logits[i] / temp + llm_rng_gumbel(rng);
            if (i == 0 || v > best_v) {
                best = i;
                best_v = v;
            }
        }
        *out = (int32_t)best;
        return LLM_OK;
    }
    llm_candidates c;
    llm_candidates_init(&c, k);
    for (uint32_t i = 0; i < n; i++) {
        llm_candidates_offer(&c, logits[i], i);
    }
    return llm_sample_candidates(&c, opt, rng, out, err);
}
