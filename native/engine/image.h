/*
 * Image loader: validates an mpllm image (image_format.h) and hands out views
 * of its sections. Validation reads only inside [data, data+len) and uses
 * 64-bit arithmetic for every offset and size, so any byte string is safe to
 * pass (the fuzzer in tests/c/fuzz_image.c holds it to that).
 *
 * After llm_image_check() returns LLM_OK every accessor below is valid for the
 * returned llm_image_info: section i sits at its fixed index in the order
 * image_format.h lists, with the size its kind and the config demand.
 */
#ifndef LLM_IMAGE_H
#define LLM_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "image_format.h"
#include "kernels.h"
#include "llm.h"
#include "wmat.h"

/* Section slots: the index of each section in the full esp32-ai order of
 * image_format.h (a layer's sections start at LLM_SEC_LAYER0 + 10*l). An arch
 * without PLE leaves the PLE slots out of its file, so the table index of a
 * slot depends on the config: llm_image_slot_index() maps one to the other,
 * and every accessor below takes a slot. */
enum {
    LLM_SEC_TOKENIZER = 0,
    LLM_SEC_ROPE = 1,
    LLM_SEC_EMBED = 2,
    LLM_SEC_PLE_ROWS = 3,
    LLM_SEC_PLE_MODEL_PROJ = 4,
    LLM_SEC_PLE_PROJ_NORM = 5,
    LLM_SEC_LAYER0 = 6,
};
enum {
    LLM_LSEC_ATTN_NORM = 0,
    LLM_LSEC_QKV,
    LLM_LSEC_ATTN_PROJ,
    LLM_LSEC_FFN_NORM,
    LLM_LSEC_GATE,
    LLM_LSEC_UP,
    LLM_LSEC_DOWN,
    LLM_LSEC_PLE_GATE,
    LLM_LSEC_PLE_PROJ,
    LLM_LSEC_PLE_NORM,
    LLM_LSEC_COUNT,
};

/* Upper bounds on a config. They keep every derived size far from overflow
 * and the int32 dot products of kernels.h exact (8*127*cols < 2^31). */
#define LLM_MAX_DIM 8192u
#define LLM_MAX_HEAD_DIM 256u     /* attention decodes one V head row on the stack */
#define LLM_MAX_FFN 32768u
#define LLM_MAX_PLE_COLS 65536u   /* n_layers * ple_dim */
#define LLM_MAX_SEQ_LEN 65536u
#define LLM_MAX_VOCAB (1u << 24)
/* sections after the layers: out_norm, head (untied), head_tiles, drafts, weights */
#define LLM_LSEC_NO_PLE LLM_LSEC_PLE_GATE /* a layer's sections without PLE */
#define LLM_MAX_LAYERS ((LLM_IMAGE_MAX_SECTIONS - LLM_SEC_LAYER0 - 5u) / LLM_LSEC_COUNT)

typedef struct llm_image_info {
    const uint8_t *data;
    size_t len;
    llm_config config;
    uint32_t n_sections;
} llm_image_info;

/* A KIND_ROWS section: rows records of row_bytes; codes then fp16 scales. */
typedef struct llm_rows {
    const uint8_t *records;
    uint32_t rows, cols, group, n_groups, row_bytes;
} llm_rows;

/* A KIND_HEAD_TILES section (image_format.h). n_tiles == 0: no certificate
 * (the pointers are then NULL). boxes: [n_tiles][2*cols_padded]. */
typedef struct llm_tiles {
    const uint16_t *order;
    const float *scales;
    const int8_t *boxes;
    uint32_t rows, tile_rows, n_tiles, cols_padded;
} llm_tiles;

/* A KIND_DRAFTS section (image_format.h), read in place: records[n-1] holds
 * contexts[n-1] records of n + 2 u16 (ctx[n], next, share). */
typedef struct llm_drafts {
    const uint16_t *records[LLM_IMAGE_DRAFTS_ORDER];
    uint32_t contexts[LLM_IMAGE_DRAFTS_ORDER];
    uint32_t max_draft;
    uint16_t min_odds[LLM_IMAGE_DRAFTS_MAX + 1u];
} llm_drafts;

/* The size the image at `head` (len bytes of it, at least its header) says
 * it has: magic, version and header size checked, nothing else. A port reads
 * the header first to know how much of a partition to map. */
llm_status llm_image_claimed_size(const uint8_t *head, size_t len, uint32_t *file_bytes,
                                  llm_error *err);

/* Validate everything: header, section table, every section's checksum,
 * layout and finiteness, and the config. `data` must be 16-byte aligned. */
llm_status llm_image_check(const uint8_t *data, size_t len, llm_image_info *info,
                           llm_error *err);

/* The n_sections the config demands (its arch, n_layers and head flag). */
uint32_t llm_image_section_count(const llm_config *c);
/* Slot <-> table index for the config's arch; LLM_IMAGE_ABSENT: the slot
 * has no section in this arch (the PLE ones without PLE). */
#define LLM_IMAGE_ABSENT 0xFFFFFFFFu
uint32_t llm_image_slot_index(const llm_config *c, uint32_t slot);
uint32_t llm_image_index_slot(const llm_config *c, uint32_t index);
/* The NUL-padded name image_format.h fixes for slot `slot`. */
void llm_image_section_name(const llm_config *c, uint32_t slot, char name[LLM_IMAGE_NAME_BYTES]);

/* Views into a checked image, by slot (present in the image's arch). */
const char *llm_image_section_label(const llm_image_info *info, uint32_t slot);
const uint8_t *llm_image_payload(const llm_image_info *info, uint32_t slot, uint32_t *size);
/* A matrix section (KIND_Q4, Q8 or F32M) as the engine holds it. */
void llm_image_matrix_view(const llm_image_info *info, uint32_t slot, llm_wmat *out);
void llm_image_rows_view(const llm_image_info *info, uint32_t slot, llm_rows *out);
void llm_image_tiles_view(const llm_image_info *info, llm_tiles *out);
void llm_image_drafts_view(const llm_image_info *info, llm_drafts *out);

/* The "weights" section: the converter's choice and what it measured. */
typedef struct llm_image_weights {
    uint32_t chosen, n_tried, positions;
    llm_image_weights_tried tried[LLM_IMAGE_WEIGHTS_MAX_TRIED];
} llm_image_weights;
void llm_image_weights_view(const llm_image_info *info, llm_image_weights *out);

/* CRC-32 (IEEE, as zlib.crc32): crc = llm_crc32(crc, p, n), start with 0. */
uint32_t llm_crc32(uint32_t crc, const uint8_t *p, size_t n);

#endif
