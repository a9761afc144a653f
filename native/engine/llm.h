/*
 * mpllm engine: the public C API that both bindings (CPython `_llm`,
 * MicroPython `_llm`) wrap. Portable C11: no MicroPython or ESP-IDF here.
 *
 * Life of a model:
 *   llm_open(image bytes, port)  validate + place sections (port decides where)
 *   llm_prefill(prompt tokens)   layers for every token, head for the last
 *   llm_step(token)              one token in, next token out
 *   llm_verify(tokens, m)        m drafted tokens in one pass, the next of each
 *   llm_rewind(pos)              drop positions >= pos (drafts, undo)
 *   llm_draft(context)           guesses for llm_verify from the image's table
 *   llm_reset()                  back to position 0, same model
 *   llm_close()
 * The engine never aborts and never allocates after llm_open except through
 * the port; every failure is an llm_status with a message in llm_error.
 */
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <stdint.h>

#define LLM_VERSION "0.1.0"

typedef enum llm_status {
    LLM_OK = 0,
    LLM_E_ARG,       /* bad argument (NULL, out-of-range token, bad option) */
    LLM_E_FORMAT,    /* image malformed: magic, sizes, section table, layout */
    LLM_E_VERSION,   /* image format version not supported */
    LLM_E_CHECKSUM,  /* a CRC does not match */
    LLM_E_CONFIG,    /* model dimensions impossible or unsupported */
    LLM_E_NOMEM,     /* the port could not place a buffer */
    LLM_E_CONTEXT,   /* no room left in the context window */
    LLM_E_STATE,     /* call out of order (e.g. step before prefill) */
    LLM_E_INTERRUPTED, /* the interrupt poll (llm_set_interrupt) asked to stop */
} llm_status;

/* Status plus a human-readable message naming what was wrong. */
typedef struct llm_error {
    llm_status status;
    char message[160];
} llm_error;

const char *llm_status_name(llm_status status);

/* Memory regions the engine asks the port for. */
typedef enum llm_region {
    LLM_REGION_FLASH = 0, /* read in place from the (mapped) image */
    LLM_REGION_FAST = 1,  /* internal SRAM */
    LLM_REGION_BULK = 2,  /* PSRAM */
    LLM_REGION_COUNT = 3,
} llm_region;

/*
 * The port: where memory comes from and how time is read. `alloc` returns
 * 16-byte aligned memory in the region asked for, or in another one (it then
 * reports the region it used through *placed), or NULL. The engine records
 * placements for llm_memory().
 */
typedef void (*llm_rows_fn)(void *arg, uint32_t row_begin, uint32_t row_end);

/* A board's memory as llm_plan counts it: the bytes FAST and BULK can still
 * give (LLM_MEMORY_UNLIMITED: no limit; FLASH's entry is unused), what a
 * block costs beyond its bytes, and whether BULK is served from FAST's bytes
 * (a board without PSRAM). The port's rule, which llm_plan follows: a FAST
 * request that does not fit goes to BULK (unless bulk_is_fast), a BULK
 * request that does not fit fails. */
#define LLM_MEMORY_UNLIMITED UINT64_MAX
typedef struct llm_memory {
    uint64_t free[LLM_REGION_COUNT];
    /* 0: a block costs its bytes; else its bytes rounded up to 16 plus this
     * (the ESP32 port's prefix) */
    uint32_t block_overhead;
    int bulk_is_fast;
} llm_memory;

typedef struct llm_port {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes, llm_region wanted, llm_region *placed);
    void (*free)(void *ctx, void *ptr);
    uint64_t (*now_us)(void *ctx);
    /* Optional (NULL: the engine calls fn(arg, 0, rows) itself). Run fn over
     * [0, rows) split across cores and return when every part is done. The
     * engine calls it only for work that pays for the hand-off (the head's
     * waves of tiles, attention by heads; engine.c), so the port just halves
     * the range. Each index is done by exactly one call and never reorders a
     * float reduction: results are identical however the range is divided. */
    void (*parallel_rows)(void *ctx, llm_rows_fn fn, void *arg, uint32_t rows);
    /* Optional (NULL: unknown, a binding then opens without a plan): what
     * alloc can still give, as llm_plan counts it. */
    void (*memory)(void *ctx, llm_memory *out);
    /* Optional (NULL: llm_set_preload refuses). A hint: start fetching
     * [addr, addr + bytes) into the data cache and return at once, while the
     * caller computes on what it already has. It must not change any memory
     * the engine reads (a cache preload only moves lines), so no result can
     * depend on it. Called only while llm_set_preload is on (llm_set_preload). */
    void (*preload)(void *ctx, const void *addr, size_t bytes);
} llm_port;

typedef struct llm_config {
    uint32_t arch; /* LLM_ARCH_* of image_format.h: 0 esp32-ai (PLE), 1 llama2.c */
    uint32_t vocab_rows, vocab_out, dim, n_layers, n_heads, head_dim, ffn;
    uint32_t n_kv_heads, kv_dim; /* kv_dim = n_kv_heads * head_dim */
    uint32_t ple_dim, seq_len, group, eot_id, flags;
    float rope_theta, norm_eps;
} llm_config;

/* Sampler. seed == 0 or temperature == 0: greedy (lowest id wins ties).
 * Otherwise Gumbel-max over the top_k best logits (top_k == 0: all of them)
 * with noise from PCG32 seeded by `seed` (see sampler.h for the exact recipe
 * the Python reference mirrors). */
typedef struct llm_sampler_options {
    float temperature;
    uint32_t top_k;
    uint64_t seed;
} llm_sampler_options;

/* Stages timed per token; also the index into llm_stats.stage_us. */
typedef enum llm_stage {
    LLM_STAGE_EMBED = 0, /* embedding + PLE input */
    LLM_STAGE_ATTN,      /* attention (norm, qkv, rope, scores, proj) */
    LLM_STAGE_FFN,
    LLM_STAGE_PLE,       /* per-layer PLE branch */
    LLM_STAGE_HEAD,
    LLM_STAGE_SAMPLE,
    LLM_STAGE_COUNT,
} llm_stage;

typedef struct llm_stats {
    uint32_t prefill_tokens;    /* tokens in the last prefill */
    uint32_t tokens;            /* tokens through the layers since reset */
    uint32_t heads;             /* head evaluations since reset */
    uint64_t prefill_us;        /* wall time of the last prefill (TTFT) */
    uint64_t stage_us[LLM_STAGE_COUNT]; /* summed since reset */
    /* bytes read per region since reset (weights, KV, rows) */
    uint64_t bytes[LLM_REGION_COUNT];
    /* the head: rows and tiles scored, waves run (summed over evaluations);
     * rows / (heads * vocab_out) is the fraction the certificate kept */
    uint64_t head_rows;
    uint32_t head_tiles, head_waves;
    uint64_t head_ids;          /* token ids read: rows that could enter a candidate list */
    uint32_t handoffs;          /* port parallel_rows calls (work sent to core 0) */
    uint32_t v_wide;            /* V rows cached as floats: their dots did not fit int16 */
    uint32_t k_wide;            /* K rows cached as floats: their dots did not fit int16 */
    uint64_t preloads;          /* port preload calls (llm_set_preload) */
    uint64_t preload_bytes;     /* bytes those calls asked the cache to stage */
} llm_stats;

typedef struct llm_engine llm_engine;

/* Validate `image` (len bytes; must stay valid and unchanged until close),
 * place its sections through `port` and return a ready engine at position 0. */
llm_status llm_open(llm_engine **out, const uint8_t *image, size_t len,
                    const llm_port *port, llm_error *err);
/* What llm_open_with may choose beyond llm_open (zeroed: llm_open's choice). */
typedef struct llm_open_options {
    /* Positions the engine holds (its KV cache, scores and wide flags are
     * sized for them): 1..the image's seq_len; 0 = the image's seq_len. The
     * engine's config then says seq_len = context, and a call past it is
     * refused with LLM_E_CONTEXT as at the image's seq_len. The tokens and
     * logits of every position below it are the same bits as without a cap. */
    uint32_t context;
    /* Nonzero: plain mode's float V placed at open, as a required buffer
     * (llm_set_plain then finds it), so that a head staged in RAM gives way
     * to it as to the KV cache (llm_open_with). The mode itself is still
     * llm_set_plain's. */
    int plain;
} llm_open_options;
/* llm_open with options (NULL: llm_open). LLM_E_ARG for a context past the
 * image's seq_len. */
llm_status llm_open_with(llm_engine **out, const uint8_t *image, size_t len,
                         const llm_port *port, const llm_open_options *options,
                         llm_error *err);
/* The image's own seq_len (its RoPE table's positions), whatever context
 * the engine was opened with. */
uint32_t llm_image_seq_len(const llm_engine *e);
/* Bytes of what the engine copies into RAM at open (matrices, norms, the
 * head's certified copy, its ids and tile tables) that found none and are
 * read in place from the image instead, or (a certified head without room
 * for its copy) go unused for the slower dense route: 0 when every weight is
 * in RAM as the image asks. */
uint64_t llm_spilled_bytes(const llm_engine *e);
void llm_close(llm_engine *e);

/* What llm_open checks of the bytes (header, sections, checksums, layout),
 * without allocating: a binding can refuse a bad image before it gives up
 * the model it has open. */
llm_status llm_check_image(const uint8_t *image, size_t len, llm_error *err);
/* The same, and the options against the image (llm_open_with's LLM_E_ARG). */
llm_status llm_check_open(const uint8_t *image, size_t len, const llm_open_options *options,
                          llm_error *err);
void llm_reset(llm_engine *e);

const llm_config *llm_get_config(const llm_engine *e);
uint32_t llm_pos(const llm_engine *e);

/* The weight formats of an image (image_format.h kinds: 2 int4, 7 int8, 8
 * fp32) and what the converter measured choosing them (its "weights"
 * section: chosen 0 and n_tried 0 when it measured nothing). */
#define LLM_WEIGHTS_TRIED_MAX 3u
typedef struct llm_weights_info {
    uint32_t layers_kind; /* every layer matrix's kind; 0 when they differ */
    uint32_t embed_kind, head_kind;
    uint32_t chosen, n_tried, positions;
    struct {
        uint32_t kind;
        float agreement, mean_abs_diff; /* greedy agreement (0..1), mean |logit diff| */
        uint32_t bytes;                 /* the whole image in that format */
    } tried[LLM_WEIGHTS_TRIED_MAX];
} llm_weights_info;
void llm_get_weights(const llm_engine *e, llm_weights_info *out);
/* "int4", "int8", "fp32" for a matrix kind, "mixed" for 0, NULL otherwise. */
const char *llm_weights_name(uint32_t kind);

llm_status llm_set_sampler(llm_engine *e, const llm_sampler_options *opt,
                           llm_error *err);

/* Feed n tokens at the current position; the head runs for the last one only.
 * *next receives the sampled next token. */
llm_status llm_prefill(llm_engine *e, const int32_t *tokens, uint32_t n,
                       int32_t *next, llm_error *err);
/* Interrupts: long prefills call poll(ctx) between passes (every few
 * tokens); when it returns nonzero the prefill stops, puts the position and
 * the sampler's stream back where they were, and returns LLM_E_INTERRUPTED:
 * nothing changed (only llm_stats' stage timers count the time spent). NULL: none. */
void llm_set_interrupt(llm_engine *e, int (*poll)(void *ctx), void *ctx);

/* Feed one token, get the next. */
llm_status llm_step(llm_engine *e, int32_t token, int32_t *next, llm_error *err);

/* Speculative decoding's pass: feed m tokens (1..LLM_VERIFY_MAX) at
 * positions llm_pos() .. + m - 1 in one pass over the weights, and write to
 * next[i] the token plain decoding would choose after tokens[0..i] (the head
 * runs for every position, in order, so the sampler's stream advances as over
 * m llm_step calls: the same tokens and logits bits). Then keep what matches:
 * if tokens[1..a] == next[0..a-1], llm_rewind(e, start + a + 1) drops the
 * rest and next[a] is the next token. */
#define LLM_VERIFY_MAX 8u
llm_status llm_verify(llm_engine *e, const int32_t *tokens, uint32_t m, int32_t *next,
                      llm_error *err);

/* Drop positions >= pos (pos <= llm_pos) in O(1): the KV cache is
 * append-only, so the next token fed goes to position pos. The sampler's
 * stream goes back to where it stood once position pos was decoded (after
 * the head evaluation that proposed the token for pos; inside a prompt, where
 * nothing was evaluated, to the prompt's start), so decoding continues exactly
 * as if the dropped positions had never been decoded (for the same sampler
 * settings). Logits are gone until the next evaluation. */
llm_status llm_rewind(llm_engine *e, uint32_t pos, llm_error *err);

/* Speculative decoding's drafter: up to max_len tokens (at most
 * llm_draft_max) that the image's self-distilled n-gram table (image_format.h
 * KIND_DRAFTS; the last 3 context tokens matter) expects after
 * context[0..n-1], written to out; returns how many. It stops where the
 * table's confidence falls below what one more position costs a pass, and
 * reads the table in place (flash on the board). A draft never changes what
 * is decoded, only how many tokens a verify pass yields. */
uint32_t llm_draft(const llm_engine *e, const int32_t *context, uint32_t n, uint32_t max_len,
                   int32_t *out);
/* The table's longest draft; 0 when the image has no table. */
uint32_t llm_draft_max(const llm_engine *e);

/* Logits (vocab_out floats) of the last head evaluation, or NULL before any.
 * Decoding does not keep them (the certified head finds the next token
 * without a logits buffer), so the first call after an evaluation runs the
 * dense head once on that evaluation's input: the same bits the dense route
 * gives. Not counted in llm_stats (it is not decoding work). */
const float *llm_logits(llm_engine *e);

/* The likeliest of some token ids at the last head evaluation: of ids[0..n)
 * (each 0..vocab_out-1, repeats allowed), or of every id when ids is NULL (n
 * 0), leaving out those whose bit is set in `skip` (bit id & 7 of byte id >>
 * 3; NULL: none): the id of the largest logit, the lowest id on a tie, into
 * *best. The same choice, ties included, as a scan of llm_logits() over
 * those ids, without that vector: for a list, only the listed ids' head rows
 * are computed (llm_head_row: the dense route's bits); for every id, the
 * dense head runs once (the logits llm_logits() then returns). LLM_E_ARG for
 * an id out of range, a NaN logit among them, or none left; LLM_E_STATE
 * before any evaluation. Token healing's choice (firmware/modules/llm.py).
 * Not counted in llm_stats (as llm_logits). */
llm_status llm_best_of(llm_engine *e, const int32_t *ids, uint32_t n, const uint8_t *skip,
                       int32_t *best, llm_error *err);

/* Plain mode: every speed-up off: the dense head into a logits buffer,
 * nothing split across cores, K and V rows cached as floats, exp/erf one
 * element at a time. Same tokens and logits, slower: the reference the
 * speed-ups are tested against. Takes effect from the next token on (K and V
 * rows cached before keep the form they were stored in: both read back as the
 * same floats). When V is cached as int16 dots and no V row can outgrow
 * them, llm_open leaves out the float V array default mode never writes; the
 * first switch to plain mode places it through the port (LLM_E_NOMEM, plain
 * mode left off, when it finds no memory). */
llm_status llm_set_plain(llm_engine *e, int plain, llm_error *err);
int llm_plain(const llm_engine *e);

/* K cached as its exact int16 integer dots (before RoPE) beside V's,
 * instead of floats after RoPE: attention rebuilds each k with the kernel's
 * operations and re-applies RoPE with the position's row of the image's
 * table, so the same tokens and logits bits; half the K bytes read per
 * cached row, for that compute and a RoPE row read per cached row. Off by
 * default: the cost model prices it slower on the S3 (tools/mpllm/costmodel,
 * the "with the int16 K cache" variants); a switch a board can A/B. From
 * the next token on; rows cached before keep their form. Only where V is
 * cached as dots (qkv rows of one scale group), not in plain or fast mode.
 * The first switch on places the rebuilt ks' scratch (n_heads * 4 *
 * head_dim floats) through the port: LLM_E_NOMEM, K left as floats, when it
 * finds no memory. */
llm_status llm_set_k_dots(llm_engine *e, int on, llm_error *err);
int llm_k_dots(const llm_engine *e);

/* Switches for what only a board can price (bench.py --ab measures each off
 * and on, interleaved; tools/mpllm/board/bench_cli.py). Each is a hint or a
 * schedule: with it on or off every token and logit is the same bits.
 *
 * Cache preload: before the engine works on the next piece of memory it asks
 * the port (llm_port.preload) to start staging its first
 * LLM_PRELOAD_MAX_BYTES in the data cache:
 *   - the next weight matrix of the layer (the next layer's first after the
 *     last), before the current matvec;
 *   - the layer's cached K and V rows (the oldest ones, read first), before
 *     its qkv matvec;
 *   - the head's next tile in each lane, before the lane scores the current.
 * Memory the port placed in internal SRAM (LLM_REGION_FAST) is never asked
 * for: it has no cache in front of it. Off by default; off in plain mode.
 * LLM_E_CONFIG when the port has no preload hook (the host port has one that
 * only counts; the ESP32-S3 port's calls the ROM's data-cache preload).
 * Takes effect at once. llm_stats counts the calls (preloads, preload_bytes).
 *
 * The data cache's size and line are not switches: they are ESP-IDF build
 * settings (CONFIG_ESP32S3_DATA_CACHE_*KB, CONFIG_ESP32S3_DATA_CACHE_LINE_*B
 * in each board's sdkconfig.board under firmware/boards), fixed when the firmware
 * is built. */
#define LLM_PRELOAD_MAX_BYTES 8192u
llm_status llm_set_preload(llm_engine *e, int on, llm_error *err);
int llm_preload(const llm_engine *e);

/* Fast mode (opt-in, LOSSY): attention over an int8 KV cache with PIE
 * scores and a cheap exp (native/engine/attention_fast.c). Stories differ
 * from exact mode's; a quality gate checks them (bench.py --fast --quality).
 * Chosen at position 0 only (the cache changes form: LLM_E_STATE otherwise)
 * and not together with plain mode; llm_reset keeps it. */
llm_status llm_set_fast(llm_engine *e, int fast, llm_error *err);
/* Whether this model's cache can take fast mode's form (LLM_E_CONFIG if
 * not), asked before anything is changed for it. */
llm_status llm_fast_fits(const llm_engine *e, llm_error *err);
int llm_fast(const llm_engine *e);

void llm_get_stats(const llm_engine *e, llm_stats *out);

/* The tokenizer section, for the Python-side tokenizer. */
const uint8_t *llm_tokenizer(const llm_engine *e, size_t *len);

/* One line per placed section or buffer: name, region, bytes. */
typedef struct llm_placement {
    const char *name;
    llm_region region;
    uint32_t bytes;
} llm_placement;
uint32_t llm_placement_count(const llm_engine *e);
const llm_placement *llm_placement_at(const llm_engine *e, uint32_t i);

/* What llm_open_with would place in `memory`, without placing it: the same
 * open run dry (every block counted against `memory` by the port's rule
 * instead of allocated, nothing copied), so there is one set of placement
 * rules. `port` gives only the dry run's own scratch (the engine struct and
 * the head certificate's check, freed before return; counted in `memory`
 * as a real open's). LLM_OK: it opens, and blocks[0..n) are what
 * llm_placement_at would list after the open (n may exceed cap: only cap
 * are written); spilled is llm_spilled_bytes, seq_len the context. Else the
 * status and message the open would give. image_seq_len: the image's
 * seq_len once its checks passed (whether or not it opens), else 0. */
typedef struct llm_plan {
    llm_placement *blocks; /* the caller's array of cap entries (may be NULL with cap 0) */
    uint32_t cap, n;
    uint64_t spilled;
    uint32_t seq_len, image_seq_len;
    /* The image as its checks left it (zeroed: not checked). Kept from one
     * call to the next on the same bytes (checked.data == image, same len),
     * the next plan skips the image's checks (its checksums read every
     * byte): the bytes must not have changed since, as for an open engine.
     * Anything else in it is refused. */
    struct llm_checked {
        const uint8_t *data;
        size_t len;
        llm_config config;
        uint32_t n_sections;
    } checked;
} llm_plan;
llm_status llm_plan_open(llm_plan *out, const uint8_t *image, size_t len, const llm_port *port,
                         const llm_memory *memory, const llm_open_options *options,
                         llm_error *err);

/* "mpllm 0.1.0 kernels=ref numerics=exact-int8act" style summary. */
const char *llm_build_info(void);

#endif
