/*
 * libFuzzer harness for the image loader and, for inputs it accepts, the
 * forward pass: nothing any byte string does may crash, hang, leak or hit
 * undefined behaviour.
 *
 * Built by tests/test_fuzz_loader.py (a short bounded run in the suite) with
 *   clang -fsanitize=fuzzer,address,undefined -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
 * FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION makes the loader compute but not
 * enforce CRCs, so mutated images get past the checksums into the layout
 * checks and the forward pass (the usual libFuzzer convention).
 *
 * Long run (hours; corpus kept between runs), from the repository root after
 * one `pytest tests/test_fuzz_loader.py` has built the harness and the seed:
 *   mkdir -p fuzz-corpus && cp build/fuzz/seed.img fuzz-corpus/
 *   build/fuzz/fuzz_image fuzz-corpus -max_len=65536 -timeout=10 -rss_limit_mb=2048 -jobs=2
 * A crash leaves crash-<sha1>; replay it with `build/fuzz/fuzz_image crash-<sha1>`.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "port_host.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the engine requires a 16-byte aligned image, as mmap and the board give */
    uint8_t *img = NULL;
    if (posix_memalign((void **)&img, 16, size ? size : 16) != 0) return 0;
    if (size) memcpy(img, data, size);
    llm_host_port hp;
    llm_port_host_init(&hp);
    /* a board-sized budget: a fuzzed header must not make us allocate gigabytes */
    hp.capacity[LLM_REGION_FAST] = 1u << 20;
    hp.capacity[LLM_REGION_BULK] = 16u << 20;
    llm_engine *e = NULL;
    llm_error err;
    if (llm_open(&e, img, size, &hp.port, &err) == LLM_OK) {
        const llm_config *c = llm_get_config(e);
        int32_t prompt[3] = {0, (int32_t)(c->vocab_rows - 1), (int32_t)(c->vocab_rows / 2)};
        int32_t next = 0;
        uint32_t n = c->seq_len < 3 ? c->seq_len : 3;
        if (llm_prefill(e, prompt, n, &next, &err) == LLM_OK) {
            llm_sampler_options opt = {0.8f, 5, 42};
            llm_set_sampler(e, &opt, &err);
            for (int k = 0; k < 3 && llm_step(e, next, &next, &err) == LLM_OK; k++) {
                if (next < 0 || (uint32_t)next >= c->vocab_out) abort();
            }
        }
        llm_close(e);
    }
    if (hp.live_blocks != 0) abort();
    free(img);
    return 0;
}
