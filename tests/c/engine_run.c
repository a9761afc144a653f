/*
 * Run the engine on an image and print what a comparison needs:
 *
 *   engine_run [--caps FAST,BULK] IMAGE N_STEPS [TEMPERATURE TOP_K SEED [plain|fast|k_dots]]
 *
 * prefills a fixed 4-token prompt, then steps N_STEPS times (greedy unless a
 * sampler is given; "plain" turns the speed-ups off, "k_dots" caches K as
 * dots), and
 * prints the build, the generated ids and the FNV-1a 64 hash of every logits
 * vector's raw bytes, and how many llm_best_of choices (made from a few
 * ids' rows before each vector) differ from a scan of the vector. tests/test_engine_on_pie_kernels.py builds it once with the
 * reference kernels and once with the PIE kernels (through the host model of
 * the vector unit) and demands identical output; the PIE build also prints
 * the PIE instructions executed per token (prefill tokens and head included).
 *
 * --caps FAST,BULK plays a board on the host: the port then has FAST bytes of
 * internal SRAM and BULK bytes of PSRAM for the engine (port_host.h: a FAST
 * request over its cap lands in BULK, a BULK one over its cap fails, and a
 * matrix that finds no memory is read in place), and the driver prints where
 * every block went ("memory NAME REGION BYTES", as Model.memory() lists them)
 * and "peak FAST BULK". tests/test_stories15m.py gives it the N16R8's figures
 * (the cost model's S3_BOARDS), so the host opens a model as that board would.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "map_image.h"
#include "port_host.h"
#if defined(LLM_KERNELS_PIE)
#include "pie_model.h"
#endif

static uint64_t fnv1a64(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* "FAST,BULK": two byte counts, each > 0; else 0 with a message. */
static int parse_caps(const char *text, uint64_t caps[2]) {
    char *end = NULL;
    errno = 0;
    unsigned long long fast = strtoull(text, &end, 10);
    if (errno == 0 && end != text && *end == ',') {
        const char *b = end + 1;
        unsigned long long bulk = strtoull(b, &end, 10);
        if (errno == 0 && end != b && *end == '\0' && fast > 0 && bulk > 0) {
            caps[0] = fast;
            caps[1] = bulk;
            return 1;
        }
    }
    fprintf(stderr, "--caps %s: give FAST,BULK, two byte counts above 0 (e.g. "
                    "--caps 301263,8323072)\n", text);
    return 0;
}

/* Token healing's call on a few ids (llm_best_of, their head rows alone),
 * made before llm_logits computes the vector, then checked against a scan of
 * it: the rows give the dense head's choice, largest value and lowest id on
 * a tie, with either kernel family. 8 ids spread over the vocabulary and a
 * repeat. */
#define BEST_N 9u
static uint32_t best_checks, best_mismatches;
#if defined(LLM_KERNELS_PIE)
static uint64_t best_pie; /* PIE instructions best_of ran, left out of the count printed */
#endif

static int best_of_rows(llm_engine *e, uint32_t vocab, uint32_t salt, int32_t *ids,
                        int32_t *chosen) {
    for (uint32_t j = 0; j + 1u < BEST_N; j++)
        ids[j] = (int32_t)((salt * 2654435761u + j * 40503u) % vocab);
    ids[BEST_N - 1u] = ids[2];
    llm_error err;
#if defined(LLM_KERNELS_PIE)
    const uint64_t before = llm_pie_counts_total();
#endif
    const int ok = llm_best_of(e, ids, BEST_N, NULL, chosen, &err) == LLM_OK;
#if defined(LLM_KERNELS_PIE)
    best_pie += llm_pie_counts_total() - before;
#endif
    if (!ok) fprintf(stderr, "best_of: %s\n", err.message);
    return ok;
}

static void best_of_check(const float *logits, const int32_t *ids, int32_t chosen) {
    int32_t best = -1;
    float top = 0.0f;
    for (uint32_t j = 0; j < BEST_N; j++) {
        const float v = logits[ids[j]];
        if (best < 0 || v > top || (v == top && ids[j] < best)) {
            best = ids[j];
            top = v;
        }
    }
    best_checks++;
    best_mismatches += best != chosen;
}

int main(int argc, char **argv) {
    uint64_t caps[2] = {0, 0};
    if (argc >= 3 && strcmp(argv[1], "--caps") == 0) {
        if (!parse_caps(argv[2], caps)) return 2;
        argc -= 2;
        argv += 2;
    }
    if (argc != 3 && argc != 6 && argc != 7) {
        fprintf(stderr, "usage: engine_run [--caps FAST,BULK] IMAGE N_STEPS [TEMPERATURE "
                        "TOP_K SEED [plain|fast|k_dots]]\n");
        return 2;
    }
    llm_host_map map;
    if (!map_image(argv[1], &map)) return 1;
    llm_error err;
    llm_host_port hp;
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_FAST] = caps[0];
    hp.capacity[LLM_REGION_BULK] = caps[1];
    llm_engine *e = NULL;
    if (llm_open(&e, map.data, map.len, &hp.port, &err) != LLM_OK) {
        fprintf(stderr, "open: %s\n", err.message);
        return 1;
    }
    if (caps[0] != 0) {
        static const char *const region[LLM_REGION_COUNT] = {"flash", "fast", "bulk"};
        for (uint32_t i = 0; i < llm_placement_count(e); i++) {
            const llm_placement *p = llm_placement_at(e, i);
            printf("memory %s %s %u\n", p->name, region[p->region], (unsigned)p->bytes);
        }
        printf("peak %llu %llu\n", (unsigned long long)hp.peak[LLM_REGION_FAST],
               (unsigned long long)hp.peak[LLM_REGION_BULK]);
    }
    const llm_config *c = llm_get_config(e);
    uint32_t steps = (uint32_t)strtoul(argv[2], NULL, 10);
    if (argc >= 6) {
        llm_sampler_options opt = {(float)strtod(argv[3], NULL),
                                   (uint32_t)strtoul(argv[4], NULL, 10),
                                   (uint64_t)strtoull(argv[5], NULL, 10)};
        if (llm_set_sampler(e, &opt, &err) != LLM_OK) {
            fprintf(stderr, "sampler: %s\n", err.message);
            return 1;
        }
    }
    if (argc == 7 && strcmp(argv[6], "fast") == 0) {
        if (llm_set_fast(e, 1, &err) != LLM_OK) {
            fprintf(stderr, "fast: %s\n", err.message);
            return 1;
        }
    } else if (argc == 7 && strcmp(argv[6], "k_dots") == 0) {
        llm_set_k_dots(e, 1, &err);
    } else if (llm_set_plain(e, argc == 7, &err) != LLM_OK) {
        fprintf(stderr, "plain: %s\n", err.message);
        return 1;
    }
    int32_t prompt[4];
    for (int i = 0; i < 4; i++) prompt[i] = (int32_t)((11u * (uint32_t)i + 5u) % c->vocab_out);
#if defined(LLM_KERNELS_PIE)
    llm_pie_counts_reset();
#endif
    int32_t next;
    if (llm_prefill(e, prompt, 4, &next, &err) != LLM_OK) {
        fprintf(stderr, "prefill: %s\n", err.message);
        return 1;
    }
    int32_t best_ids[BEST_N], chosen;
    if (!best_of_rows(e, c->vocab_out, 0u, best_ids, &chosen)) return 1;
    uint64_t hash = fnv1a64(0xcbf29ce484222325ull, llm_logits(e), c->vocab_out * sizeof(float));
    best_of_check(llm_logits(e), best_ids, chosen);
    printf("build %s\nids %d", llm_build_info(), (int)next);
    uint32_t heads = 1;
    int32_t fed[512], got[512];
    uint32_t n_fed = 0;
    for (uint32_t k = 0; k < steps && llm_pos(e) < c->seq_len; k++, heads++) {
        if (n_fed < 512) fed[n_fed] = next;
        if (llm_step(e, next, &next, &err) != LLM_OK) {
            fprintf(stderr, "step: %s\n", err.message);
            return 1;
        }
        if (n_fed < 512) got[n_fed++] = next;
        if (!best_of_rows(e, c->vocab_out, k + 1u, best_ids, &chosen)) return 1;
        hash = fnv1a64(hash, llm_logits(e), c->vocab_out * sizeof(float));
        best_of_check(llm_logits(e), best_ids, chosen);
        printf(" %d", (int)next);
    }
    /* the last few steps again as one verify pass: the same tokens */
    if (n_fed >= 2) {
        uint32_t m = n_fed < 8u ? n_fed : 8u;
        int32_t out[8];
        int same = llm_rewind(e, llm_pos(e) - m, &err) == LLM_OK &&
                   llm_verify(e, fed + n_fed - m, m, out, &err) == LLM_OK;
        for (uint32_t i = 0; same && i < m; i++) same = out[i] == got[n_fed - m + i];
        printf("\nverify_same %d", same);
    }
    /* the n-gram drafter after every prefix of what was decoded */
    if (llm_draft_max(e) > 0) {
        int32_t ctx[516], d[8];
        uint32_t n_ctx = 0, drafted = 0;
        uint64_t dh = 0xcbf29ce484222325ull;
        for (int i = 0; i < 4; i++) ctx[n_ctx++] = prompt[i];
        for (uint32_t i = 0; i < n_fed; i++) {
            ctx[n_ctx++] = fed[i];
            uint32_t k = llm_draft(e, ctx, n_ctx, 7, d);
            dh = fnv1a64(dh, d, k * sizeof(int32_t));
            drafted += k;
        }
        printf("\ndrafts %u fnv1a64 %016llx", drafted, (unsigned long long)dh);
    }
    printf("\nlogits_fnv1a64 %016llx over %u heads\n", (unsigned long long)hash, heads);
    printf("best_of_mismatches %u over %u\n", best_mismatches, best_checks);
#if defined(LLM_KERNELS_PIE)
    /* tokens through the layers: 4 prompt + (heads - 1) steps; heads as counted */
    printf("pie_instructions %llu for %u tokens and %u heads\n",
           (unsigned long long)(llm_pie_counts_total() - best_pie), 4u + heads - 1u, heads);
#endif
    llm_close(e);
    llm_host_unmap(&map);
    return 0;
}
