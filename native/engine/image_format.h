/*
 * mpllm model image (format version: LLM_IMAGE_VERSION below): the ONE description of the file that
 * `mpllm.convert` writes and the engine's loader reads. tools/mpllm/formats/image.py
 * mirrors these constants; tests/test_image_format_agrees.py proves the two agree.
 *
 * Why a format of our own: the esp32-ai model.bin is a packed stream with no
 * alignment, no checksums and no tokenizer. The board reads it through a flash
 * cache and stages part of it into RAM, so this layout is chosen for the device:
 *   - every section starts 16-byte aligned (PIE 128-bit loads ignore address
 *     bits 3:0, so a misaligned weight silently reads the wrong bytes);
 *   - matrices are already in the kernels' packed layout, so staging is a copy;
 *   - what is read per token from flash (one embedding row, one PLE row) is
 *     contiguous, each with its scales beside it;
 *   - embedding/PLE rows at or above the tokenizer's size are dropped (dead
 *     weight: ~3.3 MB on the release model).
 *
 * All integers little-endian. Sizes in bytes. CRC-32 is the IEEE/zlib one
 * (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF).
 *
 * File layout
 * -----------
 *   [0, 128)                 llm_image_header
 *   [128, 128 + 32*n)        n x llm_image_section (the section table)
 *   then sections, each at a 16-byte aligned offset, zero padding between.
 *   file_bytes == total file length (readers reject a mismatch: truncation).
 *
 * header_crc32 is the CRC-32 of the header (with header_crc32 itself read as
 * 0) followed by the whole section table. Each section's crc32 covers exactly
 * its [offset, offset+size) bytes.
 *
 * Section names (NUL-padded to 16 bytes; unknown names are an error, missing
 * ones too). kind tells how the payload is laid out:
 *   "tokenizer"      KIND_TOKENIZER
 *   "rope"           KIND_F32   f32 [seq_len][head_dim]: for position p,
 *                               [p][i] = cos(p*freq_i), [p][head_dim/2 + i] =
 *                               sin(p*freq_i), i < head_dim/2. Computed by the
 *                               converter so no libm runs on the board.
 *   "embed"          MATRIX     [vocab_rows, dim]; the tied head is its first
 *                               vocab_out rows
 *   "ple_rows"       KIND_ROWS  [vocab_rows, n_layers*ple_dim]      (esp32-ai only)
 *   "ple_model_proj" KIND_Q4    [n_layers*ple_dim, dim]             (esp32-ai only)
 *   "ple_proj_norm"  KIND_F32   [ple_dim]                           (esp32-ai only)
 *   "L<i>.attn_norm" KIND_F32   [dim]          (i = 0..n_layers-1, decimal)
 *   "L<i>.qkv"       MATRIX     [dim + 2*kv_dim, dim]   q rows 0..dim-1, then
 *                               kv_dim k rows, then kv_dim v rows
 *                               (kv_dim = n_kv_heads*head_dim)
 *   "L<i>.attn_proj" MATRIX     [dim, dim]
 *   "L<i>.ffn_norm"  KIND_F32   [dim]
 *   "L<i>.gate"      MATRIX     [ffn, dim]
 *   "L<i>.up"        MATRIX     [ffn, dim]
 *   "L<i>.down"      MATRIX     [dim, ffn]
 *   "L<i>.ple_gate"  KIND_Q4    [ple_dim, dim]                      (esp32-ai only)
 *   "L<i>.ple_proj"  KIND_Q4    [dim, ple_dim]                      (esp32-ai only)
 *   "L<i>.ple_norm"  KIND_F32   [dim]                               (esp32-ai only)
 *   "out_norm"       KIND_F32   [dim]
 *   "head"           MATRIX     [vocab_out, dim], present iff the
 *                               LLM_IMAGE_FLAG_TIED_HEAD bit is clear
 *   "head_tiles"     KIND_HEAD_TILES  the head's row order and tile boxes
 *                               for the certified head (below); always
 *                               present, n_tiles == 0 when the converter
 *                               could not certify this head
 *   "drafts"         KIND_DRAFTS  the n-gram drafter for speculative
 *                               decoding (below); always present, empty
 *                               when the converter built none
 *   "weights"        KIND_WEIGHTS  the converter's choice of weight format
 *                               and the quality it measured (below); always
 *                               present, empty when it measured none
 * MATRIX is one of the three matrix kinds, chosen per tensor: KIND_Q4, KIND_Q8
 * or KIND_F32M. esp32-ai images are KIND_Q4 throughout (the PLE matrices
 * always). A tied head has the embedding's kind. Only KIND_Q4 matrices take
 * the header's group; KIND_Q8 ones carry their own.
 * Sections appear in the file in exactly this order; a section absent for
 * the image's arch is simply left out (no placeholder).
 *
 * Architectures (the header's arch):
 *   LLM_ARCH_ESP32AI  the esp32-ai TinyStories model: PLE branch, tied head,
 *                     n_kv_heads == n_heads, norm_eps 1e-6f.
 *   LLM_ARCH_LLAMA    llama2.c's Llama: no PLE (ple_dim == 0 and the six
 *                     PLE sections above are absent), n_kv_heads dividing
 *                     n_heads (query head h reads kv head
 *                     h / (n_heads / n_kv_heads)), the head tied or untied
 *                     (LLM_IMAGE_FLAG_TIED_HEAD), over the whole vocabulary
 *                     (the converter keeps every row), norm_eps 1e-5f as
 *                     llama2.c.
 *                     The q and k rows of L<i>.qkv are already in the
 *                     engine's split-half RoPE order: within each head the
 *                     converter moves llama2.c's interleaved pairs apart
 *                     (new row j <- old row 2j, new row j + head_dim/2 <- old
 *                     row 2j + 1, j < head_dim/2), which gives the same
 *                     rotation and the same q.k up to the order of its sum.
 * Both share everything else: rmsnorm (with the header's norm_eps), SiLU
 * gated FFN, RoPE from the "rope" table, the head, the drafter.
 *
 * KIND_F32: raw f32 values, nothing else.
 *
 * KIND_Q4 (int4 weights in the matvec kernels' layout):
 *   llm_image_q4_header {rows, cols, group, row_bytes}   16 bytes
 *   codes  rows x row_bytes
 *   scales f32 [rows][n_groups]      (fp16 values of the source, widened)
 *   cols_padded = cols rounded up to 32; row_bytes = cols_padded / 2 (a
 *   multiple of 16, so every row and the scales stay 16-byte aligned).
 *   n_groups = ceil(cols / group); group must be a multiple of 32 or >= cols,
 *   so a 32-column block never straddles two groups.
 *   Codes are offset binary (code = q + 8, q in -8..7; value = q * scale).
 *   Within a row, 32-column block b occupies bytes [16b, 16b+16):
 *     byte 16b + k  (k < 16) = code(col 32b + k) | code(col 32b + k + 16) << 4
 *   Columns >= cols are padded with code 8 (value 0).
 *   This is what the PIE kernel wants: one 16-byte load feeds two 16-lane MACs
 *   (low nibbles against activations 32b..32b+15, high against +16..+31).
 *
 * KIND_Q8 (int8 weights in groups, Q8_0 as llama2.c's runq.c; kernels.h
 * llm_matvec_q8 has the arithmetic):
 *   llm_image_q4_header {rows, cols, group, row_bytes}   16 bytes
 *   codes  i8 [rows][row_bytes]   value = code * scale; columns >= cols are 0
 *   scales f32 [rows][n_groups]   finite
 *   row_bytes = cols rounded up to 32. group is a multiple of 32 below cols
 *   (a row's last group holds what is left: the converter's 172-column rows
 *   in groups of 32 have five of 32 and one of 12, then 20 zero columns), or
 *   == cols (one group: the whole row); n_groups = ceil(cols / group).
 *
 * KIND_F32M (fp32 weights; kernels.h llm_matvec_f32):
 *   llm_image_q4_header {rows, cols, group = cols, row_bytes}   16 bytes
 *   values f32 [rows][row_bytes / 4], finite; row_bytes = 4 * (cols rounded
 *   up to 4), columns >= cols are 0.
 *
 * KIND_WEIGHTS (what the converter chose and why; read by Model.config()):
 *   llm_image_weights_header {chosen, n_tried, positions, reserved = 0}  16 bytes
 *     chosen     the kind (KIND_Q4 / Q8 / F32M) of the image's layer matrices
 *                as the converter chose it, 0 when it measured nothing
 *     n_tried    records that follow, <= LLM_IMAGE_WEIGHTS_MAX_TRIED (0 with
 *                chosen == 0)
 *     positions  teacher-forced positions the figures cover
 *   then n_tried llm_image_weights_tried {kind, agreement, mean_abs_diff, bytes}:
 *     the format tried (distinct kinds), the share of positions where the
 *     engine's greedy choice equals the checkpoint's fp32 forward's (0..1),
 *     the mean |logit difference| over every position and id, and the bytes
 *     of the image as measured in that format (an empty drafter and no
 *     records here: what the format itself costs).
 *
 * KIND_ROWS (per-token lookup rows, dequantized, never multiplied):
 *   llm_image_q4_header {rows, cols, group, row_bytes}   16 bytes
 *   rows records of row_bytes each; one record is
 *     codes  ceil(cols/2) bytes, the source's order: column j in byte j>>1,
 *            even j in the low nibble
 *     scales fp16 [n_groups], n_groups = ceil(cols / group)
 *     zero padding up to row_bytes = round_up(ceil(cols/2) + 2*n_groups, 16)
 *
 * KIND_TOKENIZER (byte-level BPE tables for the plain-Python tokenizer):
 *   u32 n_vocab       (== vocab_out)
 *   u32 n_merges
 *   u32 n_special     ids of special tokens follow the byte table
 *   u32 flags         0: byte-level BPE (tokenizer.json); bit 0: llama2.c's
 *                     sentencepiece rules (tokenizer.bin: no pre-tokenizer,
 *                     a space in front, characters or byte-fallback tokens,
 *                     merges by score); other bits are an error
 *   u16 byte_ids[256] id of the single-byte token for each byte value
 *                     (0xFFFF if the vocabulary has none)
 *   u16 special_ids[n_special], then zero padding to a multiple of 4 bytes
 *   u8  lengths[n_vocab]          byte length of each token's text
 *   u8  text[sum(lengths)]        token texts as raw bytes (byte-level symbols
 *                                 already mapped back to bytes; a special
 *                                 token's text is its literal, e.g.
 *                                 "<|endoftext|>")
 *   zero padding to a multiple of 2 bytes (from the section start)
 *   u16 merges[n_merges][3]       (left id, right id, merged id), in rank
 *                                 order: merge 0 has the highest priority
 *   sentencepiece only:
 *   u16 ranks[n_merges]           priority of each merge (lower first; equal
 *                                 for equally scored merged tokens, where the
 *                                 leftmost pair wins); special_ids = BOS, EOS;
 *                                 byte_ids = the <0xNN> fallback tokens, whose
 *                                 text is the raw byte
 *
 * KIND_HEAD_TILES (what lets the engine skip head rows without changing the
 * chosen token; the proof is in native/engine/head.c):
 *   llm_image_tiles_header {rows, tile_rows, n_tiles, cols_padded}  16 bytes
 *     rows == vocab_out; cols_padded == the head's cols rounded up to 32
 *     (<= 512, which keeps every bound below 2^24); 1 <= tile_rows <= 1024
 *     when there are tiles;
 *     n_tiles == ceil(rows / tile_rows), or 0 (no certificate: the engine
 *     scores every row).
 *   u16 order[rows]     order[i] = token id of the head row the engine stages
 *                       at position i (a permutation of 0..rows-1; the
 *                       converter sorts rows by norm, largest first, so the
 *                       high-scoring rows share tiles). Zero padding to 16.
 *   f32 scale[n_tiles]  sigma_t, each a positive normal power of two.
 *                       Zero padding to 16.
 *   i8  box[n_tiles][2*cols_padded]   tile t: mid[cols_padded] then
 *                       half[cols_padded], half >= 0. (Contiguous, so the
 *                       bounds of all tiles are one int8 matrix x vector.)
 *   Tile t covers staged rows [t*tile_rows, min((t+1)*tile_rows, rows)). For
 *   every such row r, column j and weight value w = (code-8)*scale_r:
 *     (mid[j] - half[j]) * sigma_t <= w <= (mid[j] + half[j]) * sigma_t
 *   (padded columns: mid = half = 0). sigma_t being a power of two makes both
 *   products exact in f32, so the loader checks this for every weight.
 *   Empty when n_tiles == 0: the payload is the 16-byte header alone
 *   (tile_rows is then 0).
 *
 * KIND_DRAFTS (a self-distilled n-gram table: what the model itself wrote
 * after contexts of 1..3 tokens. It only decides how many tokens one verify
 * pass may yield, never which ones: a wrong draft is rejected by the pass):
 *   llm_image_drafts_header                                     32 bytes
 *     u32 contexts[3]   records for contexts of 1, 2 and 3 tokens
 *     u32 max_draft     drafts per pass at most, <= LLM_IMAGE_DRAFTS_MAX
 *     u16 min_odds[8]   draft k+1 (k = 0..) is proposed only while the
 *                       product of the shares of drafts 1..k+1 stays >=
 *                       min_odds[k] (the cost model's price of one more
 *                       position in a pass, as a fraction of a step's cost,
 *                       in units of 1/65535); zero from max_draft on
 *   then for n = 1, 2, 3: contexts[n-1] records of n + 2 u16 values
 *       ctx[n] (oldest token first), next, share
 *     in strictly increasing lexicographic order of ctx, each of the three
 *     tables zero padded to a multiple of 16 bytes. next and every ctx token
 *     are < vocab_out; share = floor(65535 * count(next) / (count(ctx) + 1))
 *     >= 1, where next is the most frequent continuation of ctx.
 *   Drafting (llm_draft, mirrored by mpllm.drafts_table.DraftsTable.draft): odds
 *   starts at 65535; for each draft take the longest ctx (3, 2, then 1
 *   tokens) that ends the context and has a record (none: stop), then
 *   odds = floor(odds * share / 65535); stop if odds < min_odds[k], else
 *   propose next and append it to the context.
 *   Empty: every count and max_draft zero.
 *
 * Header config fields describe the image, not the source: vocab_rows is the
 * number of embedding/PLE rows kept, vocab_in_source what model.bin had.
 */
#ifndef LLM_IMAGE_FORMAT_H
#define LLM_IMAGE_FORMAT_H

#include <stdint.h>

#define LLM_IMAGE_MAGIC "MPLLMIMG" /* 8 bytes, no NUL */
/* 2: + head_tiles, 3: + drafts, 4: + arch, n_kv_heads, norm_eps, 5: + KIND_Q8,
 * KIND_F32M matrices and the "weights" section. Readers refuse other versions
 * ("convert the model again": an image is rebuilt from its source in seconds). */
#define LLM_IMAGE_VERSION 5u
#define LLM_IMAGE_HEADER_BYTES 128u
#define LLM_IMAGE_SECTION_BYTES 32u
#define LLM_IMAGE_ALIGN 16u
#define LLM_IMAGE_BLOCK_COLS 32u   /* packed-layout block width */
#define LLM_IMAGE_NAME_BYTES 16u
#define LLM_IMAGE_MAX_SECTIONS 512u

#define LLM_IMAGE_FLAG_TIED_HEAD 1u
#define LLM_IMAGE_FLAGS_KNOWN LLM_IMAGE_FLAG_TIED_HEAD

/* llm_image_header.arch */
#define LLM_ARCH_ESP32AI 0u /* PLE TinyStories (esp32-ai) */
#define LLM_ARCH_LLAMA 1u   /* llama2.c's Llama, no PLE */
#define LLM_ARCH_COUNT 2u

enum llm_image_kind {
    LLM_IMAGE_KIND_F32 = 1,
    LLM_IMAGE_KIND_Q4 = 2,
    LLM_IMAGE_KIND_ROWS = 3,
    LLM_IMAGE_KIND_TOKENIZER = 4,
    LLM_IMAGE_KIND_HEAD_TILES = 5,
    LLM_IMAGE_KIND_DRAFTS = 6,
    LLM_IMAGE_KIND_Q8 = 7,
    LLM_IMAGE_KIND_F32M = 8,
    LLM_IMAGE_KIND_WEIGHTS = 9,
};

/* The "weights" section holds at most this many tried formats (llm.h's
 * LLM_WEIGHTS_TRIED_MAX, checked in image.c). */
#define LLM_IMAGE_WEIGHTS_MAX_TRIED 3u

/* The drafts table: contexts of 1..LLM_IMAGE_DRAFTS_ORDER tokens; a verify
 * pass checks the last token and at most LLM_IMAGE_DRAFTS_MAX drafts. */
#define LLM_IMAGE_DRAFTS_ORDER 3u
#define LLM_IMAGE_DRAFTS_MAX 7u

/* Bounds stay exact in int32 and below 2^24 (exactly representable as f32)
 * while (128 + 127) * 127 * cols_padded < 2^24 (|mid| <= 128, half, |xq| <= 127). */
#define LLM_IMAGE_TILES_MAX_COLS 512u
/* The engine scores a few tiles per hand-off into an SRAM buffer. */
#define LLM_IMAGE_TILES_MAX_ROWS 1024u

typedef struct llm_image_header {
    char magic[8];             /* LLM_IMAGE_MAGIC */
    uint32_t version;          /* LLM_IMAGE_VERSION */
    uint32_t header_bytes;     /* 128 */
    uint32_t file_bytes;       /* total image length */
    uint32_t n_sections;
    uint32_t header_crc32;     /* see above */
    uint32_t flags;            /* LLM_IMAGE_FLAG_* */
    uint32_t vocab_rows;       /* embedding / PLE rows stored */
    uint32_t vocab_out;        /* logits per step == tokenizer size */
    uint32_t vocab_in_source;  /* rows in the source model.bin */
    uint32_t dim;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t ffn;
    uint32_t ple_dim;
    uint32_t seq_len;
    uint32_t group;            /* source quantization group */
    float rope_theta;
    uint32_t eot_id;           /* <|endoftext|> */
    uint8_t source_sha256[32]; /* sha256(sha256(model.bin) || sha256(tokenizer.json)) */
    uint32_t arch;             /* LLM_ARCH_* */
    uint32_t n_kv_heads;       /* divides n_heads; == n_heads for esp32-ai */
    float norm_eps;            /* rmsnorm epsilon: 1e-6f esp32-ai, 1e-5f llama2.c */
    uint32_t reserved;         /* zero */
} llm_image_header;

typedef struct llm_image_section {
    char name[LLM_IMAGE_NAME_BYTES]; /* NUL-padded */
    uint32_t kind;                   /* enum llm_image_kind */
    uint32_t offset;                 /* from file start, 16-byte aligned */
    uint32_t size;                   /* payload bytes */
    uint32_t crc32;                  /* CRC-32 of the payload */
} llm_image_section;

typedef struct llm_image_q4_header {
    uint32_t rows, cols, group, row_bytes;
} llm_image_q4_header;

typedef struct llm_image_tiles_header {
    uint32_t rows, tile_rows, n_tiles, cols_padded;
} llm_image_tiles_header;

typedef struct llm_image_drafts_header {
    uint32_t contexts[LLM_IMAGE_DRAFTS_ORDER];
    uint32_t max_draft;
    uint16_t min_odds[LLM_IMAGE_DRAFTS_MAX + 1u];
} llm_image_drafts_header;

/* KIND_TOKENIZER's fixed start: the counts, then the byte table. */
typedef struct llm_image_tokenizer_header {
    uint32_t n_vocab, n_merges, n_special, flags;
    uint16_t byte_ids[256];
} llm_image_tokenizer_header;

typedef struct llm_image_weights_header {
    uint32_t chosen, n_tried, positions, reserved;
} llm_image_weights_header;

typedef struct llm_image_weights_tried {
    uint32_t kind;
    float agreement, mean_abs_diff;
    uint32_t bytes;
} llm_image_weights_tried;

_Static_assert(sizeof(llm_image_tokenizer_header) == 16 + 512, "tokenizer header size");
_Static_assert(sizeof(llm_image_weights_header) == 16, "weights header size");
_Static_assert(sizeof(llm_image_weights_tried) == 16, "weights record size");
_Static_assert(sizeof(llm_image_tiles_header) == 16, "tiles header size");
_Static_assert(sizeof(llm_image_drafts_header) == 32, "drafts header size");
_Static_assert(sizeof(llm_image_header) == LLM_IMAGE_HEADER_BYTES, "header size");
_Static_assert(sizeof(llm_image_section) == LLM_IMAGE_SECTION_BYTES, "section size");
_Static_assert(sizeof(llm_image_q4_header) == 16, "q4 header size");

#endif
