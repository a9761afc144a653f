/* Sampler; the recipe (constants, draw order, tie rules) is in sampler.h. */
#include "sampler.h"


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

uint32_t llm_rng_next(llm_rng *rng) {
    uint64_t old = rng->state;
    rng->state = old * LLM_PCG_MULT + rng->inc;
    uint32_t x = (uint32_t)(((old >> 18) ^ old) >> 27);
    uint32_t rot = (uint32_t)(old >> 59);
    return (x >> rot) | (x << ((32u - rot) & 31u));
}

float llm_rng_uniform(llm_rng *rng) {
    uint32_t r = llm_rng_next(rng);
    return (float)(((r >> 9) << 1) | 1u) * 0x1p-24f;
}

float llm_rng_gumbel(llm_rng *rng) {
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
    if (opt->seed == 0 || opt->temperature == 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        *out = (int32_t)best;
        return LLM_OK;
    }
    if (!rng) {
        return llm_fail(err, LLM_E_ARG, "llm_sample: sampling needs an rng");
    }
    float temp = opt->temperature;
    uint32_t k = (opt->top_k == 0 || opt->top_k >= n) ? n : opt->top_k;
    uint32_t best = 0;
    float best_v = 0.0f;
    if (k == n) {
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
    /* ids[0..cnt) ordered by (logit desc, id asc). Ids arrive ascending, so a
     * newcomer only moves ahead of strictly smaller logits. */
    uint32_t ids[LLM_SAMPLER_MAX_TOP_K];
    uint32_t cnt = 0;
    for (uint32_t i = 0; i < n; i++) {
        float l = logits[i];
        uint32_t j;
        if (cnt < k) {
            j = cnt++;
        } else if (l > logits[ids[k - 1]]) {
            j = k - 1;
        } else {
            continue;
        }
        while (j > 0 && l > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    /* draw order: ascending id */
    for (uint32_t a = 1; a < k; a++) {
        uint32_t id = ids[a];
        uint32_t b = a;
        while (b > 0 && ids[b - 1] > id) {
            ids[b] = ids[b - 1];
            b--;
        }
        ids[b] = id;
    }
    for (uint32_t a = 0; a < k; a++) {
        float v = logits[ids[a]] / temp + llm_rng_gumbel(rng);
        if (a == 0 || v > best_v) {
            best = ids[a];
            best_v = v;
        }
    }
    *out = (int32_t)best;
    return LLM_OK;
}
