/*
 * Rounding a size or an address up to a power of two: the one helper for
 * every "round up to 16 / 32 / 64" in native/. 16 bytes because the PIE
 * kernels' 128-bit loads ignore address bits 3:0 (every section, row and
 * buffer starts 16-byte aligned), 32 columns because a kernel block is 32
 * columns wide, 64 bytes because PSRAM is read through the data cache in
 * 64-byte lines. In 64 bits, so that a size computed from a bad config on
 * the 32-bit board cannot wrap to a small one.
 */
#ifndef LLM_ALIGN_UP_H
#define LLM_ALIGN_UP_H

#include <stdint.h>

/* n rounded up to a multiple of `to`, a power of two. */
static inline uint64_t llm_align_up(uint64_t n, uint64_t to) {
    return (n + (to - 1u)) & ~(to - 1u);
}

#endif
