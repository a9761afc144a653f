/*
 * The books both ports keep on the blocks they hand the engine: each block
 * carries a 16-byte prefix with its size and region, so a free can keep the
 * per-region `in_use` / `peak` counts without a lookup table, and a magic
 * (one per port) that tells the port's own blocks from any other pointer.
 * 16 bytes so the block after it keeps the 16-byte alignment the PIE loads
 * need (align_up.h).
 */
#ifndef LLM_PORT_BLOCKS_H
#define LLM_PORT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "llm.h"

typedef struct llm_block_prefix {
    uint64_t bytes;
    uint32_t region;
    uint32_t magic;
} llm_block_prefix;
_Static_assert(sizeof(llm_block_prefix) == 16, "prefix keeps 16-byte alignment");

/* Stamp the prefix at `raw` (16-byte aligned, sizeof(llm_block_prefix) +
 * bytes long), charge the block to region r and return the block itself. */
static inline void *llm_block_charge(void *raw, uint64_t bytes, llm_region r, uint32_t magic,
                                     uint64_t *in_use, uint64_t *peak) {
    llm_block_prefix *pre = raw;
    pre->bytes = bytes;
    pre->region = (uint32_t)r;
    pre->magic = magic;
    in_use[r] += bytes;
    if (in_use[r] > peak[r]) peak[r] = in_use[r];
    return pre + 1;
}

/* The prefix of a block llm_block_charge returned, its bytes given back to
 * its region and its magic cleared, for the port to release; NULL for NULL
 * or a pointer whose prefix does not carry the port's magic (leaking beats
 * corrupting). */
static inline llm_block_prefix *llm_block_discharge(void *ptr, uint32_t magic,
                                                    uint64_t *in_use) {
    if (ptr == NULL) return NULL;
    llm_block_prefix *pre = (llm_block_prefix *)ptr - 1;
    if (pre->magic != magic) return NULL;
    pre->magic = 0;
    in_use[pre->region] -= pre->bytes;
    return pre;
}

#endif
