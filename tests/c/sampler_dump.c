/*
 * Test driver for native/engine/sampler.c (driven by tests/test_numerics.py).
 *
 *   sampler_dump rng SEED COUNT
 *       COUNT lines "u32 uniform_bits gumbel_bits" (hex), each from a fresh
 *       draw of one generator per column kind seeded with SEED
 *   sampler_dump pick LOGITS ROWS COLS TEMP TOPK SEED
 *       LOGITS: raw f32 [ROWS][COLS]; one rng seeded once with SEED, one
 *       llm_sample per row; prints the picked ids, one per line, or
 *       "error <status> <message>" and exits 1
 *   sampler_dump batch LOGITS ROWS COLS CASES
 *       CASES: lines "TEMP TOPK SEED"; for each case a fresh rng seeded with
 *       SEED and one llm_sample per row; prints one line of ids per case
 *       ("error <status>" instead when llm_sample fails)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f32_bits.h"
#include "sampler.h"

static float *read_logits(const char *path, long rows, long cols) {
    if (rows < 1 || cols < 1) {
        fprintf(stderr, "bad shape\n");
        return NULL;
    }
    float *l = malloc((size_t)rows * (size_t)cols * sizeof *l);
    FILE *f = fopen(path, "rb");
    size_t want = (size_t)rows * (size_t)cols;
    if (!l || !f || fread(l, sizeof *l, want, f) != want) {
        fprintf(stderr, "cannot read %s\n", path);
        free(l);
        l = NULL;
    }
    if (f) {
        fclose(f);
    }
    return l;
}

/* One rng seeded with opt->seed, one llm_sample per row of l, each id printed
 * with first_fmt (row 0) or next_fmt; stops at the first failure and returns
 * its status (err says why). */
static llm_status print_samples(const float *l, long rows, long cols,
                                const llm_sampler_options *opt, const char *first_fmt,
                                const char *next_fmt, llm_error *err) {
    llm_rng rng;
    llm_rng_seed(&rng, opt->seed);
    for (long r = 0; r < rows; r++) {
        int32_t id = -1;
        llm_status st = llm_sample(l + r * cols, (uint32_t)cols, opt, &rng, &id, err);
        if (st != LLM_OK) {
            return st;
        }
        printf(r ? next_fmt : first_fmt, (int)id);
    }
    return LLM_OK;
}

static int do_batch(char **argv) {
    long rows = strtol(argv[3], NULL, 0), cols = strtol(argv[4], NULL, 0);
    float *l = read_logits(argv[2], rows, cols);
    FILE *cases = fopen(argv[5], "r");
    if (!l || !cases) {
        free(l);
        if (cases) {
            fclose(cases);
        }
        return 2;
    }
    char line[256];
    while (fgets(line, sizeof line, cases)) {
        char *p = line;
        llm_sampler_options opt;
        opt.temperature = strtof(p, &p);
        opt.top_k = (uint32_t)strtoul(p, &p, 0);
        opt.seed = strtoull(p, &p, 0);
        llm_error err;
        llm_status st = print_samples(l, rows, cols, &opt, "%d", " %d", &err);
        if (st != LLM_OK) {
            printf("error %d", (int)st);
        }
        printf("\n");
    }
    fclose(cases);
    free(l);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "batch") == 0) {
        return do_batch(argv);
    }
    if (argc == 4 && strcmp(argv[1], "rng") == 0) {
        uint64_t seed = strtoull(argv[2], NULL, 0);
        long count = strtol(argv[3], NULL, 0);
        llm_rng a, b, c;
        llm_rng_seed(&a, seed);
        llm_rng_seed(&b, seed);
        llm_rng_seed(&c, seed);
        for (long i = 0; i < count; i++) {
            uint32_t r = llm_rng_next(&a);
            float u = llm_rng_uniform(&b);
            float g = llm_rng_gumbel(&c);
            printf("%08x %08x %08x\n", r, llm_f32_bits(u), llm_f32_bits(g));
        }
        return 0;
    }
    if (argc == 8 && strcmp(argv[1], "pick") == 0) {
        long rows = strtol(argv[3], NULL, 0), cols = strtol(argv[4], NULL, 0);
        float *l = read_logits(argv[2], rows, cols);
        if (!l) {
            return 2;
        }
        llm_sampler_options opt;
        opt.temperature = strtof(argv[5], NULL);
        opt.top_k = (uint32_t)strtoul(argv[6], NULL, 0);
        opt.seed = strtoull(argv[7], NULL, 0);
        llm_error err;
        llm_status st = print_samples(l, rows, cols, &opt, "%d\n", "%d\n", &err);
        if (st != LLM_OK) {
            printf("error %d %s\n", (int)st, err.message);
        }
        free(l);
        return st == LLM_OK ? 0 : 1;
    }
    fprintf(stderr, "usage: sampler_dump rng SEED COUNT | sampler_dump pick LOGITS ROWS COLS "
                    "TEMP TOPK SEED | sampler_dump batch LOGITS ROWS COLS CASES\n");
    return 2;
}
