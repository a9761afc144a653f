/*
 * libFuzzer harness for the image loader and, for images it accepts, the
 * forward pass: nothing any byte string does may crash, hang, leak or hit
 * undefined behaviour.
 *
 * An input is either a whole image (it starts with the image magic) or, to
 * keep the corpus small, edits to the model $MPLLM_FUZZ_IMAGE: a list of
 * overwrites, insertions, erasures and truncations at any offset (an empty
 * input is that image as it is). Edits keep most of a valid image intact, so
 * mutations reach the layout checks and the forward pass rather than the
 * first header check.
 *
 * Built by tests/fuzz/fuzzrun.py with
 *   clang -fsanitize=fuzzer,address,undefined -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
 * FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION makes the loader compute but not
 * enforce CRCs, so edited images get past the checksums (the usual libFuzzer
 * convention). Runs, the corpus and the long run: tests/fuzz/fuzzrun.py.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_format.h"
#include "llm.h"
#include "port_host.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *base;
static size_t base_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("MPLLM_FUZZ_IMAGE");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (f == NULL || fseek(f, 0, SEEK_END) != 0) {
        fprintf(stderr, "fuzz_loader: set MPLLM_FUZZ_IMAGE to a model image "
                        "(tests/fuzz/fuzzrun.py does)\n");
        exit(2);
    }
    base_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    base = malloc(base_len ? base_len : 1);
    if (base == NULL || fread(base, 1, base_len, f) != base_len) exit(2);
    fclose(f);
    return 0;
}

#define MAX_GROWTH 4096u /* insertions add at most this much */

static uint32_t u24(const uint8_t **p, const uint8_t *end) {
    uint32_t v = 0;
    for (int i = 0; i < 3; i++) v |= (uint32_t)(*p < end ? *(*p)++ : 0) << (8 * i);
    return v;
}

/* The base image with the input's edits applied, into img (room for
 * base_len + MAX_GROWTH bytes); returns its length. */
static size_t edit(uint8_t *img, const uint8_t *p, size_t size) {
    const uint8_t *end = p + size;
    size_t len = base_len;
    memcpy(img, base, base_len);
    while (p < end) {
        const uint8_t op = *p++;
        const size_t at = len ? u24(&p, end) % (len + 1) : 0;
        const size_t n = (size_t)(op & 31u) + 1;
        switch (op >> 5) {
        case 0: case 1: case 2: case 3: /* overwrite n bytes (what follows) at `at` */
            for (size_t i = 0; i < n && p < end && at + i < len; i++) img[at + i] = *p++;
            break;
        case 4: /* set the byte at `at` to 0, 0xFF, or flip its top bit */
            if (at < len) img[at] = op & 1 ? 0xFF : op & 2 ? (uint8_t)(img[at] ^ 0x80) : 0;
            break;
        case 5: /* insert n bytes (what follows, else zeros) at `at` */
            if (len + n <= base_len + MAX_GROWTH) {
                memmove(img + at + n, img + at, len - at);
                for (size_t i = 0; i < n; i++) img[at + i] = p < end ? *p++ : 0;
                len += n;
            }
            break;
        case 6: { /* erase n bytes at `at` */
            size_t k = at + n <= len ? n : len - at;
            memmove(img + at, img + at + k, len - at - k);
            len -= k;
            break;
        }
        default: len = at; /* truncate */
        }
    }
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the engine requires a 16-byte aligned image, as mmap and the board give */
    const int whole = size >= 8 && memcmp(data, LLM_IMAGE_MAGIC, 8) == 0;
    uint8_t *img = NULL;
    if (posix_memalign((void **)&img, 16, whole ? size : base_len + MAX_GROWTH) != 0) return 0;
    if (whole) {
        memcpy(img, data, size);
    } else {
        size = edit(img, data, size);
    }
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
