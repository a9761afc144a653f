#define _POSIX_C_SOURCE 200809L
/*
 * Loader and engine robustness, built by tests/test_engine_errors.py with
 * ASan + UBSan (and LeakSanitizer where the platform has it).
 *
 *   engine_check IMAGE
 *
 * 1. the intact image opens and runs (prefill + steps + reset + rerun gives the
 *    same bytes);
 * 2. every placement the port can force (FAST exhausted, BULK exhausted, no
 *    memory at all) either opens and computes the SAME logits bytes or fails
 *    with LLM_E_NOMEM, leaking nothing;
 * 3. one bit flipped in every header/table byte and in a stride over the
 *    rest, and truncation at a sweep of lengths: every one must fail with a
 *    status and a message, never crash;
 * 4. the host port keeps its books per block (port_blocks.h): allocations
 *    charge their region, frees give it back, a foreign pointer is ignored.
 * Prints one line per failed expectation and exits non-zero if any.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "llm.h"
#include "llm_bind.h"
#include "port_host.h"
#include "sampler.h"

static int failures;

#define EXPECT(cond, ...)                  \
    do {                                   \
        if (!(cond)) {                     \
            failures++;                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);           \
            printf("\n");                  \
        }                                  \
    } while (0)

static uint8_t *aligned_copy(const uint8_t *src, size_t len) {
    uint8_t *p = NULL;
    if (posix_memalign((void **)&p, 16, len ? len : 16) != 0) return NULL;
    memcpy(p, src, len);
    return p;
}

/* Open img on hp (already set up), expecting success: the engine, or NULL
 * with the failure counted under `what`. */
static llm_engine *open_ok(const uint8_t *img, size_t len, llm_host_port *hp, const char *what) {
    llm_engine *e = NULL;
    llm_error err;
    llm_status st = llm_open(&e, img, len, &hp->port, &err);
    EXPECT(st == LLM_OK, "%s: %s", what, err.message);
    return st == LLM_OK ? e : NULL;
}

/* Run a fixed token script; write logits of every head into out (n_heads x vocab_out). */
static llm_status run_script(llm_engine *e, float *out, uint32_t *n_out, llm_error *err) {
    const llm_config *c = llm_get_config(e);
    int32_t prompt[5];
    for (int i = 0; i < 5; i++) prompt[i] = (int32_t)((7u * (uint32_t)i + 3u) % c->vocab_out);
    int32_t next;
    uint32_t n = c->seq_len < 5 ? c->seq_len : 5;
    llm_status st = llm_prefill(e, prompt, n, &next, err);
    if (st != LLM_OK) return st;
    *n_out = 0;
    memcpy(out, llm_logits(e), c->vocab_out * sizeof(float));
    (*n_out)++;
    for (uint32_t k = 0; k < 6 && llm_pos(e) < c->seq_len; k++) {
        st = llm_step(e, next, &next, err);
        if (st != LLM_OK) return st;
        memcpy(out + (size_t)*n_out * c->vocab_out, llm_logits(e), c->vocab_out * sizeof(float));
        (*n_out)++;
    }
    return LLM_OK;
}

/* A port that splits every matvec into uneven row ranges and runs them last
 * range first, the way a second core could finish in any order. */
static uint32_t split_calls;
static void split_rows(void *ctx, llm_rows_fn fn, void *arg, uint32_t rows) {
    (void)ctx;
    if (rows == 2u) { /* the head's two lanes: the second one first */
        fn(arg, 1, 2);
        fn(arg, 0, 1);
        split_calls++;
        return;
    }
    /* the middle cut stays inside [0, rows]: 8 attention heads would put it past the end */
    uint32_t mid = rows / 3u + (rows > 7u ? 7u : 0u);
    uint32_t cut[4] = {0, rows / 3u, mid < rows ? mid : rows, rows};
    for (int k = 2; k >= 0; k--)
        if (cut[k] < cut[k + 1]) fn(arg, cut[k], cut[k + 1]);
    split_calls++;
}

static void check_row_split(const uint8_t *img, size_t len, const float *want, uint32_t n_want) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    hp.port.parallel_rows = split_rows;
    llm_engine *e = open_ok(img, len, &hp, "open with a row-splitting port");
    if (e == NULL) return;
    size_t per = llm_get_config(e)->vocab_out;
    float *got = malloc(7 * per * sizeof(float));
    uint32_t n_got = 0;
    split_calls = 0;
    llm_error err;
    llm_status st = run_script(e, got, &n_got, &err);
    EXPECT(st == LLM_OK && split_calls > 0, "row-split run: %s (%u splits)", err.message,
           split_calls);
    EXPECT(n_got == n_want && memcmp(want, got, n_want * per * 4) == 0,
           "logits differ when the port splits rows across calls");
    printf("row split: %u matvecs split, logits identical\n", split_calls);
    free(got);
    llm_close(e);
}

/* 24 tokens sampled at T 0.8, top-40 after run_script's prompt (split or not). */
static llm_status sampled_ids(llm_engine *e, int32_t *ids, llm_error *err) {
    const llm_config *c = llm_get_config(e);
    llm_sampler_options opt = {0.8f, 40, 7};
    llm_status st = llm_set_sampler(e, &opt, err);
    if (st != LLM_OK) return st;
    int32_t prompt[5];
    for (int i = 0; i < 5; i++) prompt[i] = (int32_t)((7u * (uint32_t)i + 3u) % c->vocab_out);
    uint32_t n = c->seq_len < 5 ? c->seq_len : 5;
    st = llm_prefill(e, prompt, n, &ids[0], err);
    for (uint32_t k = 1; st == LLM_OK && k < 24 && llm_pos(e) < c->seq_len; k++)
        st = llm_step(e, ids[k - 1], &ids[k], err);
    return st;
}

/* The head's second lane too: top-40 tokens split (lanes run last first) equal unsplit. */
static void check_sampled_split(const uint8_t *img, size_t len) {
    int32_t want[24] = {0}, got[24] = {0};
    llm_error err;
    for (int split = 0; split < 2; split++) {
        llm_host_port hp;
        llm_port_host_init(&hp);
        if (split) hp.port.parallel_rows = split_rows;
        llm_engine *e = open_ok(img, len, &hp, "open for the sampled split check");
        if (e == NULL) return;
        llm_status st = sampled_ids(e, split ? got : want, &err);
        EXPECT(st == LLM_OK, "sampled run (split %d): %s", split, err.message);
        llm_close(e);
    }
    EXPECT(memcmp(want, got, sizeof want) == 0, "top-40 tokens differ when the port splits");
    printf("sampled split: 24 top-40 tokens identical\n");
}

static void check_placements(const uint8_t *img, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = open_ok(img, len, &hp, "intact image does not open");
    if (e == NULL) return;
    const llm_config *c = llm_get_config(e);
    size_t per = (size_t)c->vocab_out;
    float *want = malloc(7 * per * sizeof(float));
    float *got = malloc(7 * per * sizeof(float));
    uint32_t n_want = 0, n_got = 0;
    llm_error err;
    llm_status st = run_script(e, want, &n_want, &err);
    EXPECT(st == LLM_OK, "script failed: %s", err.message);
    llm_reset(e);
    EXPECT(llm_pos(e) == 0 && llm_logits(e) == NULL, "reset did not clear the state");
    st = run_script(e, got, &n_got, &err);
    EXPECT(st == LLM_OK && n_got == n_want && memcmp(want, got, n_want * per * 4) == 0,
           "rerun after reset differs");
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "%u blocks leaked after close", hp.live_blocks);
    check_row_split(img, len, want, n_want);
    check_sampled_split(img, len);

    /* Sweep region capacities: FAST exhausted early spills to BULK, BULK
     * exhausted makes weights read in place and required buffers fail.
     * Whatever opens must compute the same bytes as the default placement. */
    uint64_t need_fast = hp.peak[LLM_REGION_FAST], need_bulk = hp.peak[LLM_REGION_BULK];
    uint64_t total = need_fast + need_bulk;
    int opened = 0, refused = 0;
    for (uint32_t fk = 0; fk < 4; fk++) {
        uint64_t fast_cap = fk == 0 ? 1 : fk == 3 ? 0 : total * fk / 4 + 1;
        for (uint32_t bk = 0; bk <= 16; bk++) {
            llm_port_host_init(&hp);
            hp.capacity[LLM_REGION_FAST] = fast_cap;
            hp.capacity[LLM_REGION_BULK] = total * bk / 16 + 1;
            e = NULL;
            st = llm_open(&e, img, len, &hp.port, &err);
            if (st == LLM_OK) {
                opened++;
                st = run_script(e, got, &n_got, &err);
                EXPECT(st == LLM_OK && n_got == n_want &&
                           memcmp(want, got, n_want * per * 4) == 0,
                       "caps fast=%llu bulk=%llu: logits differ from the default placement",
                       (unsigned long long)hp.capacity[LLM_REGION_FAST],
                       (unsigned long long)hp.capacity[LLM_REGION_BULK]);
                llm_close(e);
            } else {
                refused++;
                EXPECT(st == LLM_E_NOMEM && err.message[0],
                       "caps fast=%llu bulk=%llu: status %d (%s), expected NOMEM",
                       (unsigned long long)hp.capacity[LLM_REGION_FAST],
                       (unsigned long long)hp.capacity[LLM_REGION_BULK], (int)st, err.message);
                EXPECT(e == NULL, "failed open left *out set");
            }
            EXPECT(hp.live_blocks == 0, "caps fast=%llu bulk=%llu: %u blocks leaked",
                   (unsigned long long)hp.capacity[LLM_REGION_FAST],
                   (unsigned long long)hp.capacity[LLM_REGION_BULK], hp.live_blocks);
        }
    }
    EXPECT(opened > 0 && refused > 0, "capacity sweep opened %d, refused %d", opened, refused);
    printf("capacity sweep: %d opened, %d refused (fast %llu, bulk %llu bytes by default)\n",
           opened, refused, (unsigned long long)need_fast, (unsigned long long)need_bulk);
    free(want);
    free(got);
}

static llm_status open_close(const uint8_t *src, size_t len, llm_error *err) {
    uint8_t *img = aligned_copy(src, len);
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = NULL;
    err->message[0] = 0;
    llm_status st = llm_open(&e, img, len, &hp.port, err);
    if (st == LLM_OK) llm_close(e);
    free(img);
    return st;
}

static void check_mutations(const uint8_t *img, size_t len) {
    llm_image_info info;
    llm_error err;
    if (llm_image_check(img, len, &info, &err) != LLM_OK) return;
    size_t table_end = LLM_IMAGE_HEADER_BYTES + (size_t)info.n_sections * LLM_IMAGE_SECTION_BYTES;
    uint8_t *m = malloc(len);
    size_t flips = 0;
    for (size_t at = 0; at < len; at += at < table_end ? 1 : 97) {
        for (int bit = 0; bit < 8; bit += (at < table_end ? 3 : 8)) {
            memcpy(m, img, len);
            m[at] ^= (uint8_t)(1u << bit);
            llm_status st = open_close(m, len, &err);
            flips++;
            EXPECT(st != LLM_OK && err.message[0],
                   "bit %d of byte %zu flipped: status %d, message '%s'", bit, at, (int)st,
                   err.message);
        }
    }
    size_t cuts = 0;
    for (size_t n = 0; n < len; n += n < table_end + 64 ? 1 : 61) {
        llm_status st = open_close(img, n, &err);
        cuts++;
        EXPECT(st == LLM_E_FORMAT && err.message[0], "truncated to %zu: status %d '%s'", n,
               (int)st, err.message);
    }
    /* a longer buffer than the header says is an error too */
    uint8_t *longer = calloc(1, len + 16);
    memcpy(longer, img, len);
    EXPECT(open_close(longer, len + 16, &err) == LLM_E_FORMAT, "16 trailing bytes accepted");
    free(longer);
    printf("checked %zu bit flips, %zu truncations\n", flips, cuts);
    free(m);
}

static void check_arguments(const uint8_t *img, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = NULL;
    llm_error err;
    EXPECT(llm_open(NULL, img, len, &hp.port, &err) == LLM_E_ARG, "NULL out accepted");
    EXPECT(llm_open(&e, img, len, NULL, &err) == LLM_E_ARG, "NULL port accepted");
    EXPECT(llm_open(&e, NULL, 0, &hp.port, &err) == LLM_E_ARG, "NULL image accepted");
    EXPECT(llm_open(&e, img + 1, len - 1, &hp.port, &err) == LLM_E_ARG,
           "misaligned image accepted");
    e = open_ok(img, len, &hp, "intact image does not open after the refusals");
    if (e == NULL) return;
    const llm_config *c = llm_get_config(e);
    int32_t next;
    int32_t bad[2] = {0, (int32_t)c->vocab_rows};
    EXPECT(llm_prefill(e, bad, 2, &next, &err) == LLM_E_ARG && llm_pos(e) == 0,
           "out-of-range token in prefill accepted or state changed");
    EXPECT(llm_step(e, -1, &next, &err) == LLM_E_ARG, "negative token accepted");
    EXPECT(llm_prefill(e, bad, 0, &next, &err) == LLM_E_ARG, "empty prefill accepted");
    llm_sampler_options opt = {-1.0f, 0, 1};
    EXPECT(llm_set_sampler(e, &opt, &err) == LLM_E_ARG, "negative temperature accepted");
    opt.temperature = 1.0f;
    opt.top_k = LLM_SAMPLER_MAX_TOP_K + 1u;
    EXPECT(llm_set_sampler(e, &opt, &err) == (opt.top_k < c->vocab_out ? LLM_E_ARG : LLM_OK),
           "top_k above the sampler's limit: wrong status");
    opt.top_k = c->vocab_out + 5u; /* covers every id: allowed */
    EXPECT(llm_set_sampler(e, &opt, &err) == LLM_OK, "top_k >= vocab refused");
    opt.top_k = 0;
    opt.seed = 0;
    EXPECT(llm_set_sampler(e, &opt, &err) == LLM_OK, "greedy options refused");
    /* fill the context, then one more token must be refused */
    int32_t tok = 1;
    llm_status st = LLM_OK;
    while (llm_pos(e) < c->seq_len && st == LLM_OK) st = llm_step(e, tok, &tok, &err);
    EXPECT(st == LLM_OK, "stepping to seq_len failed: %s", err.message);
    EXPECT(llm_step(e, tok, &tok, &err) == LLM_E_CONTEXT && err.message[0],
           "step past seq_len not refused");
    EXPECT(llm_prefill(e, &tok, 1, &next, &err) == LLM_E_CONTEXT, "prefill past seq_len accepted");
    llm_reset(e);
    EXPECT(llm_step(e, tok, &tok, &err) == LLM_OK, "step after reset failed");
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "leak after context test");
}

/* The port's books (port_blocks.h): a block charges its region and its free
 * gives it back; a pointer the port never handed out (and NULL) is ignored,
 * books untouched. */
static void check_port_books(void) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_region placed = LLM_REGION_COUNT;
    void *a = hp.port.alloc(hp.port.ctx, 100, LLM_REGION_FAST, &placed);
    void *b = hp.port.alloc(hp.port.ctx, 40, LLM_REGION_BULK, NULL);
    EXPECT(a != NULL && b != NULL && placed == LLM_REGION_FAST, "host alloc failed");
    EXPECT(((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0, "block not 16-byte aligned");
    EXPECT(hp.in_use[LLM_REGION_FAST] == 100 && hp.in_use[LLM_REGION_BULK] == 40 &&
               hp.live_blocks == 2,
           "books after two allocs: fast %llu bulk %llu live %u",
           (unsigned long long)hp.in_use[LLM_REGION_FAST],
           (unsigned long long)hp.in_use[LLM_REGION_BULK], hp.live_blocks);
    hp.port.free(hp.port.ctx, a);
    uint8_t *foreign = aligned_copy((const uint8_t[32]){0}, 32);
    hp.port.free(hp.port.ctx, foreign + 16);
    hp.port.free(hp.port.ctx, NULL);
    EXPECT(hp.in_use[LLM_REGION_FAST] == 0 && hp.in_use[LLM_REGION_BULK] == 40 &&
               hp.live_blocks == 1 && hp.peak[LLM_REGION_FAST] == 100,
           "books after freeing one block, a foreign pointer and NULL: fast %llu bulk %llu "
           "live %u", (unsigned long long)hp.in_use[LLM_REGION_FAST],
           (unsigned long long)hp.in_use[LLM_REGION_BULK], hp.live_blocks);
    hp.port.free(hp.port.ctx, b);
    EXPECT(hp.in_use[LLM_REGION_BULK] == 0 && hp.live_blocks == 0, "books after the last free");
    free(foreign);
}

/* Plain mode's float V (llm_set_plain places it when V is cached as dots no
 * row can outgrow): with no BULK left the switch fails with LLM_E_NOMEM and
 * leaves plain mode off and the decoding as it was; with room it is placed
 * once and freed at close. */
static void check_plain_memory(const uint8_t *img, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = open_ok(img, len, &hp, "intact image does not open");
    if (e == NULL) return;
    const uint64_t opened = hp.in_use[LLM_REGION_BULK];
    llm_error err;
    EXPECT(llm_set_plain(e, 1, &err) == LLM_OK, "set_plain: %s", err.message);
    const uint64_t values = hp.in_use[LLM_REGION_BULK] - opened;
    EXPECT(llm_set_plain(e, 0, &err) == LLM_OK && llm_set_plain(e, 1, &err) == LLM_OK &&
           hp.in_use[LLM_REGION_BULK] == opened + values, "the float V was placed twice");
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "%u blocks leaked after close", hp.live_blocks);
    if (values == 0) {
        printf("plain memory: the float V is placed at open\n");
        return;
    }
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_BULK] = opened;
    e = open_ok(img, len, &hp, "the image does not open in the BULK it used");
    if (e == NULL) return;
    const llm_config *c = llm_get_config(e);
    float *want = malloc(7 * (size_t)c->vocab_out * sizeof(float));
    float *got = malloc(7 * (size_t)c->vocab_out * sizeof(float));
    uint32_t n_want = 0, n_got = 0;
    llm_status st = run_script(e, want, &n_want, &err);
    EXPECT(st == LLM_OK, "script failed: %s", err.message);
    st = llm_set_plain(e, 1, &err);
    EXPECT(st == LLM_E_NOMEM && strstr(err.message, "plain mode's float V") != NULL &&
           !llm_plain(e), "set_plain without memory: status %d, %s", (int)st, err.message);
    llm_reset(e);
    st = run_script(e, got, &n_got, &err);
    EXPECT(st == LLM_OK && n_got == n_want &&
           memcmp(want, got, (size_t)n_want * c->vocab_out * sizeof(float)) == 0,
           "a refused set_plain changed the decoding");
    free(want);
    free(got);
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "%u blocks leaked after close", hp.live_blocks);
    printf("plain memory: the float V (%llu bytes) placed by set_plain, refused without room\n",
           (unsigned long long)values);
}

/* K as dots places its scratch once, FAST else BULK (engine_open.c
 * llm_set_k_dots); with no memory left the switch fails with LLM_E_NOMEM,
 * leaving K as floats; closing frees it. */
static void check_k_dots_memory(const uint8_t *img, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = open_ok(img, len, &hp, "intact image does not open");
    if (e == NULL) return;
    const uint64_t fast = hp.in_use[LLM_REGION_FAST], bulk = hp.in_use[LLM_REGION_BULK];
    const uint32_t blocks = hp.live_blocks;
    llm_error err;
    EXPECT(llm_set_k_dots(e, 1, &err) == LLM_OK && llm_set_k_dots(e, 0, &err) == LLM_OK &&
           llm_set_k_dots(e, 1, &err) == LLM_OK && llm_k_dots(e) &&
           hp.live_blocks == blocks + 1u && hp.in_use[LLM_REGION_FAST] > fast,
           "set_k_dots: %s, %u blocks (%u at open)", err.message, hp.live_blocks, blocks);
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "%u blocks leaked after close", hp.live_blocks);
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_FAST] = fast;
    hp.capacity[LLM_REGION_BULK] = bulk;
    e = open_ok(img, len, &hp, "the image does not open in the memory it used");
    if (e == NULL) return;
    const llm_status st = llm_set_k_dots(e, 1, &err);
    EXPECT(st == LLM_E_NOMEM && strstr(err.message, "K as dots' scratch") != NULL &&
           !llm_k_dots(e), "set_k_dots without memory: status %d, %s", (int)st, err.message);
    llm_close(e);
    EXPECT(hp.live_blocks == 0, "%u blocks leaked after close", hp.live_blocks);
    printf("k_dots memory: its scratch placed once, refused without room\n");
}

/* The plan (llm_plan_open) against the open it plans, under the same port:
 * the same status and message, and when it opens the same blocks (name,
 * region, bytes, in order), spilled bytes and context. Counted in
 * plans_checked. */
static uint32_t plans_checked;
static void expect_plan_is_open(const llm_plan *plan, llm_status planned, const char *plan_msg,
                                const llm_engine *e, llm_status opened, const char *open_msg,
                                uint32_t context) {
    plans_checked++;
    EXPECT(planned == opened && (opened == LLM_OK || strcmp(plan_msg, open_msg) == 0),
           "context %u: plan %d (%s), open %d (%s)", context, (int)planned, plan_msg,
           (int)opened, open_msg);
    if (planned != LLM_OK || opened != LLM_OK) return;
    int same = plan->n == llm_placement_count(e) && plan->spilled == llm_spilled_bytes(e) &&
               plan->seq_len == llm_get_config(e)->seq_len;
    for (uint32_t i = 0; same && i < plan->n && i < plan->cap; i++) {
        const llm_placement *p = llm_placement_at(e, i), *q = &plan->blocks[i];
        same = strcmp(p->name, q->name) == 0 && p->region == q->region && p->bytes == q->bytes;
        EXPECT(same, "context %u: block %u planned %s %d %u, placed %s %d %u", context, i,
               q->name, (int)q->region, q->bytes, p->name, (int)p->region, p->bytes);
    }
    EXPECT(same, "context %u: plan of %u blocks (spilled %llu) is not the open's %u (%llu)",
           context, plan->n, (unsigned long long)plan->spilled, llm_placement_count(e),
           (unsigned long long)llm_spilled_bytes(e));
}

/* Whether the model opens at `context` under these caps, in plain mode if
 * asked (its float V placed too); closed again. *spilled gets what it read
 * in place (llm_spilled_bytes). The plan of the same open is checked
 * against it (expect_plan_is_open). */
static int opens_under(const uint8_t *img, size_t len, uint32_t context, uint64_t fast_cap,
                       uint64_t bulk_cap, int plain, uint64_t *spilled) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_FAST] = fast_cap;
    hp.capacity[LLM_REGION_BULK] = bulk_cap;
    const llm_open_options o = {context, plain};
    llm_placement blocks[256];
    llm_plan plan = {.blocks = blocks, .cap = 256u};
    llm_memory memory;
    hp.port.memory(hp.port.ctx, &memory);
    llm_error plan_err, err;
    const llm_status planned = llm_plan_open(&plan, img, len, &hp.port, &memory, &o, &plan_err);
    EXPECT(hp.live_blocks == 0, "context %u: the plan left %u blocks", context, hp.live_blocks);
    llm_engine *e = NULL;
    const llm_status opened = llm_open_with(&e, img, len, &hp.port, &o, &err);
    expect_plan_is_open(&plan, planned, plan_err.message, e, opened, err.message, context);
    if (opened != LLM_OK) return 0;
    const int ok = !plain || llm_set_plain(e, 1, &err) == LLM_OK;
    *spilled = llm_spilled_bytes(e);
    llm_close(e);
    return ok;
}

/* A plan's `checked` (the image as its checks left it) handed to the next
 * plan of the same bytes gives the same plan; handed to other bytes (a
 * copy, or a corrupted image) it is refused, never trusted. */
static void check_plan_reuse(const uint8_t *img, size_t len) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_memory memory;
    hp.port.memory(hp.port.ctx, &memory);
    llm_placement first[256], again[256];
    llm_plan a = {.blocks = first, .cap = 256u}, b = {.blocks = again, .cap = 256u};
    llm_error err;
    EXPECT(llm_plan_open(&a, img, len, &hp.port, &memory, NULL, &err) == LLM_OK &&
               a.checked.data == img && a.checked.len == len,
           "plan: %s", err.message);
    b.checked = a.checked;
    EXPECT(llm_plan_open(&b, img, len, &hp.port, &memory, NULL, &err) == LLM_OK && b.n == a.n &&
               memcmp(first, again, a.n * sizeof first[0]) == 0,
           "a plan reusing the checks differs: %s", err.message);
    uint8_t *copy = aligned_copy(img, len);
    b.checked = a.checked;
    const llm_status st = llm_plan_open(&b, copy, len, &hp.port, &memory, NULL, &err);
    EXPECT(st == LLM_E_ARG && strstr(err.message, "another image's") != NULL,
           "another image's checks: status %d, %s", (int)st, err.message);
    free(copy);
    EXPECT(hp.live_blocks == 0, "plans left %u blocks", hp.live_blocks);
    printf("plan reuse: the checks kept for the same bytes, refused for others\n");
}

/* The opens made: engine_check is linked with --wrap=llm_open_with
 * (tests/test_engine_errors.py), so every call of it, the binding's
 * included, comes here first. A plan (llm_plan_open) is not an open. */
static uint32_t opens_made;
llm_status __real_llm_open_with(llm_engine **out, const uint8_t *image, size_t len,
                                const llm_port *port, const llm_open_options *options,
                                llm_error *err);
llm_status __wrap_llm_open_with(llm_engine **out, const uint8_t *image, size_t len,
                                const llm_port *port, const llm_open_options *options,
                                llm_error *err);
llm_status __wrap_llm_open_with(llm_engine **out, const uint8_t *image, size_t len,
                                const llm_port *port, const llm_open_options *options,
                                llm_error *err) {
    opens_made++;
    return __real_llm_open_with(out, image, len, port, options, err);
}

/* The least BULK cap (FAST capped at fast_cap) under which the model opens
 * at `context`, found by bisection in 1..hi (hi opens it): the head and the
 * required buffers just fit, the core matrices mostly read in place. */
static uint64_t least_cap(const uint8_t *img, size_t len, uint32_t context, uint64_t fast_cap,
                          uint64_t hi, int plain) {
    uint64_t lo = 1u, spilled = 0;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2u;
        if (opens_under(img, len, context, fast_cap, mid, plain, &spilled)) hi = mid;
        else lo = mid + 1u;
    }
    return hi;
}

/* The region of the engine's placement named `name` (LLM_REGION_COUNT if none). */
static llm_region region_of(const llm_engine *e, const char *name) {
    for (uint32_t i = 0; i < llm_placement_count(e); i++)
        if (strcmp(llm_placement_at(e, i)->name, name) == 0) return llm_placement_at(e, i)->region;
    return LLM_REGION_COUNT;
}

/* The head gives way to the required buffers: everything in one capped
 * region (as a board's internal SRAM without PSRAM), at the least cap under
 * which the model opens at its seq_len the head is read in place from flash
 * (its staged copy would have left the KV cache no room: llm_open_with's
 * second try) and the logits are those of the default placement. */
static void check_head_gives_way(const uint8_t *img, size_t len) {
    const char *head = "head"; /* tied or not (image.c) */
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = open_ok(img, len, &hp, "intact image does not open");
    if (e == NULL) return;
    const uint32_t seq = llm_get_config(e)->seq_len, vocab = llm_get_config(e)->vocab_out;
    const uint64_t everything = 2u * (hp.in_use[LLM_REGION_FAST] + hp.in_use[LLM_REGION_BULK]);
    EXPECT(region_of(e, head) == LLM_REGION_BULK, "unlimited: the head is not staged");
    float *want = malloc(7u * vocab * sizeof(float)), *got = malloc(7u * vocab * sizeof(float));
    uint32_t n_want = 0, n_got = 0;
    llm_error err;
    EXPECT(run_script(e, want, &n_want, &err) == LLM_OK, "script failed: %s", err.message);
    llm_close(e);
    const uint64_t cap = least_cap(img, len, seq, 1u, everything, 0);
    llm_port_host_init(&hp);
    hp.capacity[LLM_REGION_FAST] = 1u;
    hp.capacity[LLM_REGION_BULK] = cap;
    e = NULL;
    const llm_open_options o = {seq, 0};
    EXPECT(llm_open_with(&e, img, len, &hp.port, &o, &err) == LLM_OK, "least cap: %s",
           err.message);
    if (e != NULL) {
        EXPECT(region_of(e, head) == LLM_REGION_FLASH && region_of(e, "kv_cache") == LLM_REGION_BULK,
               "least cap %llu: head in %d, KV cache in %d", (unsigned long long)cap,
               (int)region_of(e, head), (int)region_of(e, "kv_cache"));
        EXPECT(run_script(e, got, &n_got, &err) == LLM_OK && n_got == n_want &&
                   memcmp(want, got, (size_t)n_want * vocab * sizeof(float)) == 0,
               "the head read in place changed the logits");
        llm_close(e);
    }
    EXPECT(hp.live_blocks == 0, "%u blocks leaked", hp.live_blocks);
    free(want);
    free(got);
    printf("head gives way: at %llu bytes in one region the head is read in place and the KV "
           "cache opens\n", (unsigned long long)cap);
}

/* What a sweep of memory caps is scaled by: the image's seq_len and
 * `everything`, twice the bytes an open with no cap takes (FAST and BULK
 * together). 0 (and said): the intact image does not open. */
static int cap_sweep_scale(const uint8_t *img, size_t len, uint32_t *seq, uint64_t *everything) {
    llm_host_port hp;
    llm_port_host_init(&hp);
    llm_engine *e = open_ok(img, len, &hp, "intact image does not open");
    if (e == NULL) return 0;
    *seq = llm_get_config(e)->seq_len;
    *everything = 2u * (hp.in_use[LLM_REGION_FAST] + hp.in_use[LLM_REGION_BULK]);
    llm_close(e);
    return 1;
}

/* Model() with no context (llm_bind_open, context 0) against every context
 * tried one by one, over a sweep of memory caps on two boards (FAST
 * unlimited with BULK capped; FAST gone, everything competing for BULK as
 * for a board's one internal SRAM), plain and not: the image's seq_len if
 * it opens; else, when a whole story's context (min(256, seq_len)) opens with
 * weights read in place, that context, or the longest with every weight in
 * RAM if longer (a weight in flash costs less than a story cut short);
 * else the longest context with every weight in RAM if that holds at least
 * min(64, seq_len / 2) positions; else the longest that opens; a memory
 * error if none does. A context asked for is never changed. The caps: none,
 * sixteenths of twice what an unlimited open takes, and the least under
 * which a story's context opens (weights in flash: a sweep in sixteenths
 * steps over that narrow band). */
static void check_fitting_context(const uint8_t *img, size_t len) {
    llm_host_port hp;
    uint32_t seq;
    uint64_t everything;
    if (!cap_sweep_scale(img, len, &seq, &everything)) return;
    uint32_t most_opens = 0;
    const uint32_t least = seq / 2u < 64u ? seq / 2u : 64u;
    const uint32_t story = seq < 256u ? seq : 256u;
    int by_seq = 0, by_story = 0, in_ram = 0, longest = 0, refused = 0;
    uint8_t *opens = malloc(seq + 1u), *whole = malloc(seq + 1u);
    for (int shared = 0; shared < 2; shared++) {
        for (int plain = 0; plain < 2; plain++) {
            for (uint32_t k = 0; k <= 17; k++) {
                const uint64_t fast_cap = shared ? 1u : 0u;
                const uint64_t bulk_cap =
                    k == 0    ? 1u /* none */
                    : k <= 16 ? everything * k / 16u
                              : least_cap(img, len, story, fast_cap, everything, plain);
                uint64_t spilled = 0;
                uint32_t any = 0, ram = 0;
                for (uint32_t c = 1; c <= seq; c++) {
                    opens[c] = (uint8_t)opens_under(img, len, c, fast_cap, bulk_cap, plain,
                                                    &spilled);
                    whole[c] = (uint8_t)(opens[c] && spilled == 0);
                    if (opens[c]) any = c;
                    if (whole[c] && (c == 1 || ram == c - 1u)) ram = c;
                }
                uint32_t want = 0;
                if (opens[seq]) want = seq;
                else if (opens[story]) want = ram > story ? ram : story;
                else if (any && ram >= least) want = ram;
                else want = any;
                llm_port_host_init(&hp);
                hp.capacity[LLM_REGION_FAST] = fast_cap;
                hp.capacity[LLM_REGION_BULK] = bulk_cap;
                llm_bind_model m = {NULL, &hp.port, NULL, 0};
                llm_bind_error err;
                const llm_bind_kind asked = llm_bind_open(&m, img, len, plain, 0, seq, NULL, &err);
                EXPECT((asked == LLM_BIND_OK) == (opens[seq] != 0),
                       "shared %d plain %d cap %llu: the seq_len asked for was changed", shared,
                       plain, (unsigned long long)bulk_cap);
                if (asked == LLM_BIND_OK) llm_bind_close(&m);
                opens_made = 0;
                const llm_bind_kind kind = llm_bind_open(&m, img, len, plain, 0, 0, NULL, &err);
                const uint32_t got = kind == LLM_BIND_OK ? llm_get_config(m.engine)->seq_len : 0u;
                /* one open, or none where the plans say no context opens */
                EXPECT(opens_made == (want != 0u), "shared %d plain %d cap %llu: %u opens",
                       shared, plain, (unsigned long long)bulk_cap, opens_made);
                if (opens_made > most_opens) most_opens = opens_made;
                EXPECT(got == want && (kind == LLM_BIND_OK || kind == LLM_BIND_ENGINE_ERROR),
                       "shared %d plain %d cap %llu: context %u, expected %u (kind %d)", shared,
                       plain, (unsigned long long)bulk_cap, got, want, (int)kind);
                EXPECT(kind != LLM_BIND_OK || llm_plain(m.engine) == plain,
                       "shared %d plain %d: opened in the wrong mode", shared, plain);
                if (kind == LLM_BIND_OK) llm_bind_close(&m);
                EXPECT(hp.live_blocks == 0, "shared %d plain %d: %u blocks leaked", shared,
                       plain, hp.live_blocks);
                if (!want) refused++;
                else if (want == seq) by_seq++;
                else if (want == story) by_story++;
                else if (want == ram) in_ram++;
                else longest++;
            }
        }
    }
    free(opens);
    free(whole);
    printf("fitting context: %d caps by the seq_len, %d by a story's context (%u), %d with "
           "every weight in RAM, %d the longest that opens, %d refused\n", by_seq, by_story,
           story, in_ram, longest, refused);
    printf("plans: %u checked against their opens; Model() opened at most %u time(s)\n",
           plans_checked, most_opens);
}

/* A port whose memory hook claims more than its allocator gives, as a
 * fragmented heap does (free bytes in no one block): the plan then picks a
 * context that does not open, and Model() must still open a shorter one, for
 * real, rather than fail. */
static void (*honest_memory)(void *ctx, llm_memory *out); /* the host port's own hook */
static uint64_t lie_bytes;
static void lying_memory(void *ctx, llm_memory *out) {
    honest_memory(ctx, out);
    if (out->free[LLM_REGION_BULK] != LLM_MEMORY_UNLIMITED) out->free[LLM_REGION_BULK] += lie_bytes;
}

static void check_planned_open_falls_back(const uint8_t *img, size_t len) {
    llm_host_port hp;
    uint32_t seq;
    uint64_t everything;
    if (!cap_sweep_scale(img, len, &seq, &everything)) return;
    int tried = 0, fell_back = 0;
    for (uint32_t k = 1; k <= 16; k++) { /* everything competing for BULK, as on the N8 */
        llm_bind_model m = {NULL, &hp.port, NULL, 0};
        llm_bind_error err;
        llm_port_host_init(&hp);
        hp.capacity[LLM_REGION_FAST] = 1u;
        hp.capacity[LLM_REGION_BULK] = everything * k / 16u;
        if (llm_bind_open(&m, img, len, 0, 0, 0, NULL, &err) != LLM_BIND_OK) continue;
        const uint32_t honest = llm_get_config(m.engine)->seq_len;
        llm_bind_close(&m);
        if (honest == seq) continue; /* (only where Model() chooses a context) */
        tried++;
        honest_memory = hp.port.memory;
        lie_bytes = everything / 16u;
        hp.port.memory = lying_memory;
        opens_made = 0;
        const llm_bind_kind kind = llm_bind_open(&m, img, len, 0, 0, 0, NULL, &err);
        EXPECT(kind == LLM_BIND_OK, "cap %u/16 with a lying memory hook: Model() failed (%s)", k,
               err.message);
        if (kind != LLM_BIND_OK) continue;
        fell_back += opens_made > 1u;
        llm_bind_close(&m);
        EXPECT(hp.live_blocks == 0, "cap %u/16: %u blocks leaked", k, hp.live_blocks);
    }
    EXPECT(fell_back > 0, "the lying hook never made the planned open fail: the check is idle");
    printf("planned open falls back: %d of %d caps opened a shorter context for real\n",
           fell_back, tried);
}

/* The cache preload hint (llm_set_preload): the host port's hook counts
 * exactly the calls and bytes the engine reports while the switch is on,
 * none while it is off, and the same tokens either way; a port without the
 * hook refuses the switch (LLM_E_CONFIG) and leaves it off. */
static void check_preload_hook(const uint8_t *img, size_t len) {
    int32_t ids[2][24] = {{0}};
    llm_error err;
    for (int on = 0; on < 2; on++) {
        llm_host_port hp;
        llm_port_host_init(&hp);
        llm_engine *e = open_ok(img, len, &hp, "open for the preload check");
        if (e == NULL) return;
        EXPECT(llm_set_preload(e, on, &err) == LLM_OK && llm_preload(e) == on,
               "set_preload(%d): %s", on, err.message);
        llm_status st = sampled_ids(e, ids[on], &err);
        EXPECT(st == LLM_OK, "sampled run (preload %d): %s", on, err.message);
        llm_stats stats;
        llm_get_stats(e, &stats);
        EXPECT(hp.preloads == stats.preloads && hp.preload_bytes == stats.preload_bytes,
               "preload %d: the port counted %llu calls (%llu bytes), the engine %llu (%llu)",
               on, (unsigned long long)hp.preloads, (unsigned long long)hp.preload_bytes,
               (unsigned long long)stats.preloads, (unsigned long long)stats.preload_bytes);
        EXPECT((hp.preloads > 0) == on && hp.preload_bytes <= hp.preloads * LLM_PRELOAD_MAX_BYTES,
               "preload %d: %llu calls, %llu bytes", on, (unsigned long long)hp.preloads,
               (unsigned long long)hp.preload_bytes);
        llm_close(e);
    }
    EXPECT(memcmp(ids[0], ids[1], sizeof ids[0]) == 0, "tokens differ with preload on");
    llm_host_port bare;
    llm_port_host_init(&bare);
    bare.port.preload = NULL;
    llm_engine *e = open_ok(img, len, &bare, "open without a preload hook");
    if (e == NULL) return;
    EXPECT(llm_set_preload(e, 1, &err) == LLM_E_CONFIG && !llm_preload(e),
           "set_preload on a port without the hook: %s", err.message);
    EXPECT(llm_set_preload(e, 0, &err) == LLM_OK, "set_preload(0) without the hook: %s",
           err.message);
    llm_close(e);
    printf("preload hook: counted by the host port when on, never when off, same tokens\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s IMAGE\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *raw = malloc((size_t)n);
    if (fread(raw, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "short read\n");
        return 2;
    }
    fclose(f);
    uint8_t *img = aligned_copy(raw, (size_t)n);
    free(raw);
    printf("%s\n", llm_build_info());
    check_port_books();
    check_placements(img, (size_t)n);
    check_plain_memory(img, (size_t)n);
    check_k_dots_memory(img, (size_t)n);
    check_plan_reuse(img, (size_t)n);
    check_preload_hook(img, (size_t)n);
    check_fitting_context(img, (size_t)n);
    check_planned_open_falls_back(img, (size_t)n);
    check_head_gives_way(img, (size_t)n);
    check_arguments(img, (size_t)n);
    check_mutations(img, (size_t)n);
    free(img);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
