/*
 * The n-gram drafter (llm.h llm_draft): the longest 3-, 2- or 1-token context
 * the image's table knows, its most frequent continuation, while the running
 * product of the continuations' shares stays above what one more position
 * costs a verify pass (the table's min_odds, written by the converter from
 * the cost model). Binary search over the sorted records in place: no copy,
 * no allocation, a few dozen flash reads per draft.
 *
 * Exact integers only, so mpllm.drafts_table.DraftsTable.draft (the converter's
 * mirror) proposes the same tokens; tests/test_ngram_drafter_engine.py compares the two.
 */
#include "engine_state.h"

/* Index of the record whose context equals key[0..n-1], or -1. */
static int32_t find(const uint16_t *records, uint32_t count, uint32_t n, const uint32_t *key) {
    uint32_t lo = 0, hi = count;
    const uint32_t stride = n + 2u;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        const uint16_t *r = records + (size_t)mid * stride;
        int order = 0;
        for (uint32_t j = 0; j < n && order == 0; j++)
            order = r[j] < key[j] ? -1 : r[j] > key[j] ? 1 : 0;
        if (order == 0) return (int32_t)mid;
        if (order < 0)
            lo = mid + 1u;
        else
            hi = mid;
    }
    return -1;
}

uint32_t llm_draft_max(const llm_engine *e) {
    return e ? e->w.drafts.max_draft : 0u;
}

uint32_t llm_draft(const llm_engine *e, const int32_t *context, uint32_t n, uint32_t max_len,
                   int32_t *out) {
    if (!e || !out || (n && !context)) return 0;
    const llm_drafts *t = &e->w.drafts;
    if (max_len > t->max_draft) max_len = t->max_draft;
    /* the last LLM_IMAGE_DRAFTS_ORDER tokens, oldest first; ids that no
     * table can hold (negative or >= 2^16) match nothing */
    uint32_t tail[LLM_IMAGE_DRAFTS_ORDER + LLM_IMAGE_DRAFTS_MAX];
    uint32_t have = 0;
    for (uint32_t i = n > LLM_IMAGE_DRAFTS_ORDER ? n - LLM_IMAGE_DRAFTS_ORDER : 0; i < n; i++)
        tail[have++] = context[i] >= 0 && context[i] <= 0xFFFF ? (uint32_t)context[i] : 0x10000u;
    uint32_t odds = 0xFFFFu, made = 0;
    while (made < max_len) {
        int32_t hit = -1;
        uint32_t order = have < LLM_IMAGE_DRAFTS_ORDER ? have : LLM_IMAGE_DRAFTS_ORDER;
        for (; order > 0 && hit < 0; order--) {
            hit = find(t->records[order - 1], t->contexts[order - 1], order,
                       tail + have - order);
            if (hit >= 0) break;
        }
        if (hit < 0) break;
        const uint16_t *r = t->records[order - 1] + (size_t)hit * (order + 2u);
        odds = odds * r[order + 1] / 0xFFFFu;
        if (odds < t->min_odds[made]) break;
        out[made++] = r[order];
        tail[have++] = r[order];
    }
    return made;
}
