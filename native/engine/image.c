/*
 * Image loader and validator (format: image_format.h). One file on purpose:
 * every check of the format, in the order the spec states it.
 *
 * Order of checks: what must hold before anything else can be read safely
 * comes first (length, magic, version, table bounds, header CRC), then the
 * config, then each section (bounds, checksum, then its inner layout). A
 * checksum is tested before the layout inside a section so that corruption is
 * reported as corruption, not as a confusing layout error.
 */
#include "image.h"

#include <stddef.h>
#include <string.h>

#include "align_up.h"
#include "f32_bits.h"
#include "llm_error.h"

static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

uint32_t llm_crc32(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* One of image_format.h's structs (section entry, q4/tiles/drafts/weights/
 * tokenizer headers) read from the image's bytes into its named fields: a
 * copy, as header_read does for the header. The image's numbers are
 * little-endian and only a little-endian host opens one (check_host), so the
 * struct's layout is the file's (image_format.h asserts every size). */
#define READ_STRUCT(dst, src) memcpy((dst), (src), sizeof *(dst))

/* Record k of a "weights" payload (after its header). */
static const uint8_t *weights_tried_at(const uint8_t *p, uint32_t k) {
    return p + sizeof(llm_image_weights_header) + (size_t)k * sizeof(llm_image_weights_tried);
}

static int f32_bits_finite(uint32_t bits) { return (bits & 0x7F800000u) != 0x7F800000u; }

/* A finite f32 that an fp16 holds exactly (image_format.h: Q4 scales are the
 * source's fp16 values, widened). Among other things this keeps every weight
 * (code - 8) * scale exact in f32, which the certified head's box check needs. */
static int f32_bits_half_exact(uint32_t bits) {
    uint32_t mag = bits & 0x7FFFFFFFu;
    if (mag == 0) return 1;
    int32_t e = (int32_t)(mag >> 23) - 127; /* a widened fp16 is a normal f32 */
    if (e > 15 || e < -24 || (mag >> 23) == 0) return 0;
    /* fp16 normals keep 10 fraction bits; subnormals (e < -14) fewer */
    int32_t keep = e >= -14 ? 10 : 10 - (-14 - e);
    return (mag & ((1u << (23 - keep)) - 1u)) == 0;
}

_Static_assert(LLM_IMAGE_WEIGHTS_MAX_TRIED == LLM_WEIGHTS_TRIED_MAX, "weights records");

static const char *const layer_names[LLM_LSEC_COUNT] = {
    "attn_norm", "qkv", "attn_proj", "ffn_norm", "gate",
    "up", "down", "ple_gate", "ple_proj", "ple_norm",
};

static int has_ple(const llm_config *c) { return c->arch == LLM_ARCH_ESP32AI; }

/* Sections before the layers and per layer in the config's arch. */
static uint32_t prefix_sections(const llm_config *c) {
    return has_ple(c) ? (uint32_t)LLM_SEC_LAYER0 : (uint32_t)LLM_SEC_PLE_ROWS;
}
static uint32_t layer_sections(const llm_config *c) {
    return has_ple(c) ? (uint32_t)LLM_LSEC_COUNT : (uint32_t)LLM_LSEC_NO_PLE;
}

uint32_t llm_image_section_count(const llm_config *c) {
    /* layers, out_norm, the head if untied, head_tiles, drafts, weights */
    const int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    return prefix_sections(c) + layer_sections(c) * c->n_layers + 1u + (tied ? 0u : 1u) + 3u;
}

uint32_t llm_image_slot_index(const llm_config *c, uint32_t slot) {
    const uint32_t layers_end = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers;
    if (has_ple(c) || slot < LLM_SEC_PLE_ROWS) return slot;
    if (slot < LLM_SEC_LAYER0) return LLM_IMAGE_ABSENT;
    if (slot < layers_end) {
        const uint32_t l = (slot - LLM_SEC_LAYER0) / LLM_LSEC_COUNT;
        const uint32_t k = (slot - LLM_SEC_LAYER0) % LLM_LSEC_COUNT;
        if (k >= LLM_LSEC_NO_PLE) return LLM_IMAGE_ABSENT;
        return LLM_SEC_PLE_ROWS + LLM_LSEC_NO_PLE * l + k;
    }
    return slot - layers_end + LLM_SEC_PLE_ROWS + LLM_LSEC_NO_PLE * c->n_layers;
}

uint32_t llm_image_index_slot(const llm_config *c, uint32_t index) {
    const uint32_t layers_end = prefix_sections(c) + layer_sections(c) * c->n_layers;
    if (has_ple(c) || index < LLM_SEC_PLE_ROWS) return index;
    if (index < layers_end) {
        const uint32_t l = (index - LLM_SEC_PLE_ROWS) / LLM_LSEC_NO_PLE;
        const uint32_t k = (index - LLM_SEC_PLE_ROWS) % LLM_LSEC_NO_PLE;
        return LLM_SEC_LAYER0 + LLM_LSEC_COUNT * l + k;
    }
    return index - layers_end + LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers;
}

/* Writes the NUL-padded 16-byte name image_format.h fixes for a slot. */
void llm_image_section_name(const llm_config *c, uint32_t slot, char name[LLM_IMAGE_NAME_BYTES]) {
    static const char *const fixed[LLM_SEC_LAYER0] = {
        "tokenizer", "rope", "embed", "ple_rows", "ple_model_proj", "ple_proj_norm",
    };
    const uint32_t layers_end = LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers;
    const int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    memset(name, 0, LLM_IMAGE_NAME_BYTES);
    const char *s = NULL;
    if (slot < LLM_SEC_LAYER0) {
        s = fixed[slot];
    } else if (slot < layers_end) {
        uint32_t l = (slot - LLM_SEC_LAYER0) / LLM_LSEC_COUNT;
        uint32_t k = (slot - LLM_SEC_LAYER0) % LLM_LSEC_COUNT;
        /* "L<l>." then the field; l < LLM_MAX_LAYERS keeps it within 15 chars */
        char digits[12];
        int nd = 0;
        do {
            digits[nd++] = (char)('0' + l % 10);
            l /= 10;
        } while (l && nd < 11);
        size_t at = 0;
        name[at++] = 'L';
        while (nd > 0 && at < LLM_IMAGE_NAME_BYTES - 1) name[at++] = digits[--nd];
        if (at < LLM_IMAGE_NAME_BYTES - 1) name[at++] = '.';
        for (const char *f = layer_names[k]; *f && at < LLM_IMAGE_NAME_BYTES - 1; f++)
            name[at++] = *f;
        return;
    } else if (slot == layers_end) {
        s = "out_norm";
    } else if (slot == layers_end + 1u && !tied) {
        s = "head";
    } else if (slot == layers_end + (tied ? 1u : 2u)) {
        s = "head_tiles";
    } else if (slot == layers_end + (tied ? 2u : 3u)) {
        s = "drafts";
    } else {
        s = "weights";
    }
    size_t n = strlen(s);
    memcpy(name, s, n < LLM_IMAGE_NAME_BYTES - 1 ? n : LLM_IMAGE_NAME_BYTES - 1);
}

/* Table entry `index` (a table position, not a slot). */
static void section_at(const llm_image_info *info, uint32_t index, llm_image_section *out) {
    READ_STRUCT(out, info->data + LLM_IMAGE_HEADER_BYTES + (size_t)index * LLM_IMAGE_SECTION_BYTES);
}

static const uint8_t *payload_at(const llm_image_info *info, uint32_t index, uint32_t *size) {
    llm_image_section s;
    section_at(info, index, &s);
    if (size) *size = s.size;
    return info->data + s.offset;
}

const char *llm_image_section_label(const llm_image_info *info, uint32_t slot) {
    /* table names equal the expected ones (checked) and are at most 15 chars,
     * so the NUL-padded bytes in the image are a valid C string */
    const uint32_t index = llm_image_slot_index(&info->config, slot);
    return (const char *)(info->data + LLM_IMAGE_HEADER_BYTES +
                          (size_t)index * LLM_IMAGE_SECTION_BYTES);
}

const uint8_t *llm_image_payload(const llm_image_info *info, uint32_t slot, uint32_t *size) {
    return payload_at(info, llm_image_slot_index(&info->config, slot), size);
}

static void q4_header(const uint8_t *p, llm_image_q4_header *h) { READ_STRUCT(h, p); }

static uint32_t ceil_div(uint32_t a, uint32_t b) { return a / b + (a % b != 0); }

/* KIND_Q4 and KIND_ROWS payloads open with the same header: section i's
 * dimensions into the fields llm_q4 and llm_rows both have; returns where
 * its codes (Q4) or records (ROWS) start. */
static const uint8_t *matrix_view(const llm_image_info *info, uint32_t i, uint32_t *rows,
                                  uint32_t *cols, uint32_t *group, uint32_t *n_groups,
                                  uint32_t *row_bytes) {
    const uint8_t *p = llm_image_payload(info, i, NULL);
    llm_image_q4_header h;
    q4_header(p, &h);
    *rows = h.rows;
    *cols = h.cols;
    *group = h.group;
    *n_groups = ceil_div(h.cols, h.group);
    *row_bytes = h.row_bytes;
    return p + sizeof(llm_image_q4_header);
}

void llm_image_matrix_view(const llm_image_info *info, uint32_t i, llm_wmat *out) {
    llm_image_section s;
    section_at(info, llm_image_slot_index(&info->config, i), &s);
    out->kind = s.kind;
    out->data = matrix_view(info, i, &out->rows, &out->cols, &out->group, &out->n_groups,
                            &out->row_bytes);
    /* 16-byte aligned: the payload is, and so is every row; F32M has none */
    out->scales = (const float *)(const void *)(out->data + (size_t)out->rows * out->row_bytes);
    if (s.kind == LLM_IMAGE_KIND_F32M) {
        out->n_groups = 0;
        out->scales = NULL;
    }
}

/* The last three sections of every image (image_format.h's order), by their
 * place from the end of the table. */
enum { FROM_END_TILES = 3u, FROM_END_DRAFTS = 2u, FROM_END_WEIGHTS = 1u };

/* The payload of one of the last three sections, its fixed header copied to
 * h (h_bytes). */
static const uint8_t *last_payload(const llm_image_info *info, uint32_t from_end, void *h,
                                   size_t h_bytes) {
    const uint8_t *p = payload_at(info, info->n_sections - from_end, NULL);
    memcpy(h, p, h_bytes);
    return p;
}

void llm_image_weights_view(const llm_image_info *info, llm_image_weights *out) {
    llm_image_weights_header h;
    const uint8_t *p = last_payload(info, FROM_END_WEIGHTS, &h, sizeof h);
    *out = (llm_image_weights){.chosen = h.chosen, .n_tried = h.n_tried,
                               .positions = h.positions};
    for (uint32_t k = 0; k < out->n_tried; k++) READ_STRUCT(&out->tried[k], weights_tried_at(p, k));
}

void llm_image_rows_view(const llm_image_info *info, uint32_t i, llm_rows *out) {
    out->records = matrix_view(info, i, &out->rows, &out->cols, &out->group, &out->n_groups,
                               &out->row_bytes);
}

void llm_image_tiles_view(const llm_image_info *info, llm_tiles *out) {
    llm_image_tiles_header h;
    const uint8_t *p = last_payload(info, FROM_END_TILES, &h, sizeof h);
    *out = (llm_tiles){.rows = h.rows, .tile_rows = h.tile_rows, .n_tiles = h.n_tiles,
                       .cols_padded = h.cols_padded};
    if (out->n_tiles == 0) return;
    const uint8_t *q = p + sizeof(llm_image_tiles_header);
    out->order = (const uint16_t *)(const void *)q;
    q += llm_align_up(2u * (uint64_t)out->rows, LLM_IMAGE_ALIGN);
    out->scales = (const float *)(const void *)q;
    q += llm_align_up(4u * (uint64_t)out->n_tiles, LLM_IMAGE_ALIGN);
    out->boxes = (const int8_t *)(const void *)q;
}

static uint64_t drafts_table_bytes(uint32_t n, uint64_t records) {
    return llm_align_up(records * (n + 2u) * 2u, LLM_IMAGE_ALIGN);
}

void llm_image_drafts_view(const llm_image_info *info, llm_drafts *out) {
    llm_image_drafts_header h;
    const uint8_t *p = last_payload(info, FROM_END_DRAFTS, &h, sizeof h);
    *out = (llm_drafts){.max_draft = h.max_draft};
    memcpy(out->min_odds, h.min_odds, sizeof out->min_odds);
    const uint8_t *q = p + sizeof h;
    for (uint32_t n = 1; n <= LLM_IMAGE_DRAFTS_ORDER; n++) {
        out->contexts[n - 1] = h.contexts[n - 1];
        out->records[n - 1] = (const uint16_t *)(const void *)q;
        q += drafts_table_bytes(n, out->contexts[n - 1]);
    }
}

/* ---- config ------------------------------------------------------------ */

/* Read through its bits: a fast-math build must not assume v finite. */
static int positive_finite(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return f32_bits_finite(bits) && v > 0.0f;
}

/* The fields the architecture fixes (image_format.h), each refused with its
 * own message; checked after the dimensions they depend on. */
static llm_status check_arch(const llm_config *c, llm_error *err) {
    if (c->arch == LLM_ARCH_LLAMA && c->ple_dim != 0)
        return llm_fail(err, LLM_E_CONFIG, "ple_dim = %lu, a llama2.c image has no PLE (0)",
                        (unsigned long)c->ple_dim);
    if (c->n_kv_heads == 0 || c->n_heads == 0 || c->n_heads % c->n_kv_heads != 0)
        return llm_fail(err, LLM_E_CONFIG, "n_kv_heads = %lu does not divide n_heads %lu",
                        (unsigned long)c->n_kv_heads, (unsigned long)c->n_heads);
    if (c->arch == LLM_ARCH_ESP32AI && c->n_kv_heads != c->n_heads)
        return llm_fail(err, LLM_E_CONFIG, "n_kv_heads = %lu, an esp32-ai image has n_heads (%lu)",
                        (unsigned long)c->n_kv_heads, (unsigned long)c->n_heads);
    if (!positive_finite(c->norm_eps))
        return llm_fail(err, LLM_E_CONFIG, "norm_eps must be positive and finite");
    return LLM_OK;
}

static llm_status check_config(const llm_config *c, llm_error *err) {
    if (c->arch >= LLM_ARCH_COUNT)
        return llm_fail(err, LLM_E_CONFIG, "arch %lu is unknown (0: esp32-ai, 1: llama2.c)",
                        (unsigned long)c->arch);
#define LIMIT(field, lo, hi)                                                              \
    if (c->field < (lo) || c->field > (hi))                                               \
        return llm_fail(err, LLM_E_CONFIG, #field " = %lu, must be in %lu..%lu", \
                        (unsigned long)c->field, (unsigned long)(lo), (unsigned long)(hi));
    LIMIT(dim, 1u, LLM_MAX_DIM)
    LIMIT(n_layers, 1u, LLM_MAX_LAYERS)
    LIMIT(n_heads, 1u, LLM_MAX_DIM)
    LIMIT(ffn, 1u, LLM_MAX_FFN)
    if (c->arch == LLM_ARCH_ESP32AI) LIMIT(ple_dim, 1u, LLM_MAX_PLE_COLS)
    LIMIT(seq_len, 1u, LLM_MAX_SEQ_LEN)
    LIMIT(vocab_rows, 1u, LLM_MAX_VOCAB)
    LIMIT(vocab_out, 1u, LLM_MAX_VOCAB)
    LIMIT(group, 1u, 0xFFFFFFFFu)
#undef LIMIT
    if (c->dim % c->n_heads != 0)
        return llm_fail(err, LLM_E_CONFIG, "dim %lu is not a multiple of n_heads %lu",
                        (unsigned long)c->dim, (unsigned long)c->n_heads);
    if (c->head_dim > LLM_MAX_HEAD_DIM)
        return llm_fail(err, LLM_E_CONFIG, "head_dim %lu exceeds %u", (unsigned long)c->head_dim,
                        (unsigned)LLM_MAX_HEAD_DIM);
    if (c->head_dim % 2 != 0)
        return llm_fail(err, LLM_E_CONFIG,
                        "head_dim %lu is odd (split-half RoPE needs it even)",
                        (unsigned long)c->head_dim);
    if (c->group % LLM_IMAGE_BLOCK_COLS != 0) {
        /* a 32-column kernel block must never straddle two groups */
        uint32_t widest = c->dim > c->ffn ? c->dim : c->ffn;
        if (c->ple_dim > widest) widest = c->ple_dim;
        if (c->group < widest)
            return llm_fail(err, LLM_E_CONFIG,
                            "group %lu is neither a multiple of 32 nor >= %lu columns",
                            (unsigned long)c->group, (unsigned long)widest);
    }
    if ((uint64_t)c->n_layers * c->ple_dim > LLM_MAX_PLE_COLS)
        return llm_fail(err, LLM_E_CONFIG, "n_layers*ple_dim = %llu exceeds %lu",
                        (unsigned long long)c->n_layers * c->ple_dim,
                        (unsigned long)LLM_MAX_PLE_COLS);
    if (c->vocab_out > c->vocab_rows)
        return llm_fail(err, LLM_E_CONFIG,
                        "vocab_out %lu > vocab_rows %lu (every output id needs an "
                        "embedding row)",
                        (unsigned long)c->vocab_out, (unsigned long)c->vocab_rows);
    if (c->eot_id >= c->vocab_out)
        return llm_fail(err, LLM_E_CONFIG, "eot_id %lu is not below vocab_out %lu",
                        (unsigned long)c->eot_id, (unsigned long)c->vocab_out);
    if (!positive_finite(c->rope_theta))
        return llm_fail(err, LLM_E_CONFIG, "rope_theta must be positive and finite");
    return check_arch(c, err);
}

/* ---- per-section layout ------------------------------------------------ */

typedef struct expect {
    uint32_t kind;  /* KIND_Q4 for a matrix: with `matrix` set, Q8 and F32M too */
    uint32_t rows, cols, group; /* Q4 / ROWS */
    uint64_t f32_count;  /* F32 */
    int matrix;     /* a matrix whose format the converter chooses per tensor */
} expect;

static expect section_expect(const llm_config *c, uint32_t slot) {
    const uint32_t i = slot;
    expect e = {0, 0, 0, c->group, 0, 0};
    uint32_t D = c->dim, F = c->ffn, P = c->ple_dim, L = c->n_layers;
    switch (i) {
    case LLM_SEC_TOKENIZER: e.kind = LLM_IMAGE_KIND_TOKENIZER; return e;
    case LLM_SEC_ROPE:
        e.kind = LLM_IMAGE_KIND_F32;
        e.f32_count = (uint64_t)c->seq_len * c->head_dim;
        return e;
    case LLM_SEC_EMBED:
        e.kind = LLM_IMAGE_KIND_Q4;
        e.matrix = 1;
        e.rows = c->vocab_rows;
        e.cols = D;
        return e;
    case LLM_SEC_PLE_ROWS:
        e.kind = LLM_IMAGE_KIND_ROWS;
        e.rows = c->vocab_rows;
        e.cols = L * P;
        return e;
    case LLM_SEC_PLE_MODEL_PROJ: e.kind = LLM_IMAGE_KIND_Q4; e.rows = L * P; e.cols = D; return e;
    case LLM_SEC_PLE_PROJ_NORM: e.kind = LLM_IMAGE_KIND_F32; e.f32_count = P; return e;
    default: break;
    }
    if (i < LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L) {
        e.kind = LLM_IMAGE_KIND_Q4;
        switch ((i - LLM_SEC_LAYER0) % LLM_LSEC_COUNT) {
        case LLM_LSEC_ATTN_NORM:
        case LLM_LSEC_FFN_NORM:
        case LLM_LSEC_PLE_NORM: e.kind = LLM_IMAGE_KIND_F32; e.f32_count = D; break;
        case LLM_LSEC_QKV: e.rows = D + 2u * c->kv_dim; e.cols = D; e.matrix = 1; break;
        case LLM_LSEC_ATTN_PROJ: e.rows = D; e.cols = D; e.matrix = 1; break;
        case LLM_LSEC_GATE:
        case LLM_LSEC_UP: e.rows = F; e.cols = D; e.matrix = 1; break;
        case LLM_LSEC_DOWN: e.rows = D; e.cols = F; e.matrix = 1; break;
        case LLM_LSEC_PLE_GATE: e.rows = P; e.cols = D; break;
        case LLM_LSEC_PLE_PROJ: e.rows = D; e.cols = P; break;
        default: break;
        }
        return e;
    }
    if (i == LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L) {
        e.kind = LLM_IMAGE_KIND_F32;
        e.f32_count = D;
        return e;
    }
    if (i == LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L + 1u && !(c->flags & LLM_IMAGE_FLAG_TIED_HEAD)) {
        e.kind = LLM_IMAGE_KIND_Q4;
        e.matrix = 1;
        e.rows = c->vocab_out;
        e.cols = D;
        return e;
    }
    if (i == LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L + ((c->flags & LLM_IMAGE_FLAG_TIED_HEAD) ? 1u : 2u)) {
        e.kind = LLM_IMAGE_KIND_HEAD_TILES;
        e.rows = c->vocab_out;
        e.cols = D;
        return e;
    }
    if (i == LLM_SEC_LAYER0 + LLM_LSEC_COUNT * L + ((c->flags & LLM_IMAGE_FLAG_TIED_HEAD) ? 2u : 3u)) {
        e.kind = LLM_IMAGE_KIND_DRAFTS;
        e.rows = c->vocab_out;
        return e;
    }
    e.kind = LLM_IMAGE_KIND_WEIGHTS;
    return e;
}

static const char *kind_name(uint32_t kind) {
    switch (kind) {
    case LLM_IMAGE_KIND_F32: return "F32";
    case LLM_IMAGE_KIND_Q4: return "Q4";
    case LLM_IMAGE_KIND_ROWS: return "ROWS";
    case LLM_IMAGE_KIND_TOKENIZER: return "TOKENIZER";
    case LLM_IMAGE_KIND_HEAD_TILES: return "HEAD_TILES";
    case LLM_IMAGE_KIND_DRAFTS: return "DRAFTS";
    case LLM_IMAGE_KIND_Q8: return "Q8";
    case LLM_IMAGE_KIND_F32M: return "F32M";
    case LLM_IMAGE_KIND_WEIGHTS: return "WEIGHTS";
    default: return "unknown";
    }
}

static llm_status check_f32(const char *name, const uint8_t *p, uint32_t size, uint64_t count,
                            llm_error *err) {
    if ((uint64_t)size != count * 4u)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, config needs %llu f32 = %llu",
                        name, (unsigned long)size, (unsigned long long)count,
                        (unsigned long long)(count * 4u));
    for (uint64_t k = 0; k < count; k++)
        if (!f32_bits_finite(rd32(p + 4 * k)))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': value %llu is NaN or Inf", name,
                            (unsigned long long)k);
    return LLM_OK;
}

/* A section's fixed header (h_bytes at p) copied to h; LLM_E_FORMAT where the
 * section (size bytes) is too small to hold it. */
static llm_status read_header(const char *name, const uint8_t *p, uint32_t size, void *h,
                              size_t h_bytes, llm_error *err) {
    if (size < h_bytes)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, too small for its header",
                        name, (unsigned long)size);
    memcpy(h, p, h_bytes);
    return LLM_OK;
}

static llm_status check_q4_header(const char *name, uint32_t kind, const uint8_t *p,
                                  uint32_t size, const expect *x, llm_image_q4_header *h,
                                  llm_error *err) {
    llm_status st = read_header(name, p, size, h, sizeof *h, err);
    if (st != LLM_OK) return st;
    if (h->rows != x->rows || h->cols != x->cols)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': shape [%lu, %lu], config needs [%lu, %lu]",
                        name, (unsigned long)h->rows, (unsigned long)h->cols,
                        (unsigned long)x->rows, (unsigned long)x->cols);
    /* the header's group is the int4 matrices' (and the PLE rows'); Q8 and
     * F32M sections carry their own */
    if ((kind == LLM_IMAGE_KIND_Q4 || kind == LLM_IMAGE_KIND_ROWS) && h->group != x->group)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': group %lu, the header says %lu", name,
                        (unsigned long)h->group, (unsigned long)x->group);
    return LLM_OK;
}

static llm_status check_q4_layout(const char *name, const uint8_t *p, uint32_t size,
                                  const llm_image_q4_header *h, llm_error *err) {
    if (h->group < h->cols && h->group % LLM_IMAGE_BLOCK_COLS != 0)
        return llm_fail(err, LLM_E_FORMAT,
                        "section '%s': group %lu is neither >= cols %lu nor a multiple of 32",
                        name, (unsigned long)h->group, (unsigned long)h->cols);
    uint64_t cols_padded = llm_align_up(h->cols, LLM_IMAGE_BLOCK_COLS);
    if (h->row_bytes != cols_padded / 2u)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': row_bytes %lu, layout needs %llu", name,
                        (unsigned long)h->row_bytes, (unsigned long long)(cols_padded / 2u));
    uint64_t n_groups = ceil_div(h->cols, h->group);
    uint64_t codes = (uint64_t)h->rows * h->row_bytes;
    uint64_t want = sizeof(llm_image_q4_header) + codes + (uint64_t)h->rows * n_groups * 4u;
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, layout needs %llu", name,
                        (unsigned long)size, (unsigned long long)want);
    const uint8_t *sc = p + sizeof(llm_image_q4_header) + codes;
    for (uint64_t k = 0; k < (uint64_t)h->rows * n_groups; k++) {
        uint32_t bits = rd32(sc + 4 * k);
        if (!f32_bits_finite(bits))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': scale of row %llu is NaN or Inf",
                            name, (unsigned long long)(k / n_groups));
        if (!f32_bits_half_exact(bits))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': scale of row %llu is not an fp16 "
                            "value widened to f32", name, (unsigned long long)(k / n_groups));
    }
    return LLM_OK;
}

static llm_status check_rows_layout(const char *name, const uint8_t *p, uint32_t size,
                                    const llm_image_q4_header *h, llm_error *err) {
    uint64_t n_groups = ceil_div(h->cols, h->group);
    uint64_t code_bytes = ((uint64_t)h->cols + 1u) / 2u;
    uint64_t rb = llm_align_up(code_bytes + 2u * n_groups, LLM_IMAGE_ALIGN);
    if (h->row_bytes != rb)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': row_bytes %lu, layout needs %llu", name,
                        (unsigned long)h->row_bytes, (unsigned long long)rb);
    uint64_t want = sizeof(llm_image_q4_header) + (uint64_t)h->rows * rb;
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, layout needs %llu", name,
                        (unsigned long)size, (unsigned long long)want);
    const uint8_t *rec = p + sizeof(llm_image_q4_header);
    for (uint64_t r = 0; r < h->rows; r++, rec += rb)
        for (uint64_t g = 0; g < n_groups; g++)
            if ((rd16(rec + code_bytes + 2 * g) & 0x7C00u) == 0x7C00u)
                return llm_fail(err, LLM_E_FORMAT, "section '%s': scale of row %llu is NaN or Inf",
                                name, (unsigned long long)r);
    return LLM_OK;
}

/* KIND_Q8 and KIND_F32M (image_format.h): the row width, the group, the
 * size, finite scales or values. */
static llm_status check_wide_layout(const char *name, uint32_t kind, const uint8_t *p,
                                    uint32_t size, const llm_image_q4_header *h, llm_error *err) {
    const int q8 = kind == LLM_IMAGE_KIND_Q8;
    if (q8 ? (h->group != h->cols && (h->group == 0 || h->group > h->cols ||
                                      h->group % LLM_IMAGE_BLOCK_COLS != 0))
           : h->group != h->cols)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': group %lu, the layout needs %s", name,
                        (unsigned long)h->group, q8 ? "cols or a multiple of 32 below it" : "cols");
    const uint64_t rb = q8 ? llm_align_up(h->cols, LLM_IMAGE_BLOCK_COLS)
                           : 4u * llm_align_up(h->cols, 4u);
    if (h->row_bytes != rb)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': row_bytes %lu, layout needs %llu", name,
                        (unsigned long)h->row_bytes, (unsigned long long)rb);
    const uint64_t n_groups = q8 && h->cols > 0 ? ceil_div(h->cols, h->group) : 0u;
    const uint64_t body = (uint64_t)h->rows * rb;
    const uint64_t want = sizeof(llm_image_q4_header) + body + (uint64_t)h->rows * n_groups * 4u;
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, layout needs %llu", name,
                        (unsigned long)size, (unsigned long long)want);
    /* the f32 words to check: the scales (Q8), every value (F32M) */
    const uint8_t *f = p + sizeof(llm_image_q4_header) + (q8 ? body : 0u);
    const uint64_t words = q8 ? (uint64_t)h->rows * n_groups : body / 4u;
    for (uint64_t k = 0; k < words; k++)
        if (!f32_bits_finite(rd32(f + 4 * k)))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': %s of row %llu is NaN or Inf", name,
                            q8 ? "scale" : "a value",
                            (unsigned long long)(q8 ? k / n_groups : k / (rb / 4u)));
    return LLM_OK;
}

/* KIND_Q4, Q8, F32M and KIND_ROWS sections open with the same header, checked
 * once here; what follows it is each kind's own layout. */
static llm_status check_matrix(const char *name, uint32_t kind, const uint8_t *p, uint32_t size,
                               const expect *x, llm_error *err) {
    llm_image_q4_header h = {0, 0, 0, 0};
    llm_status st = check_q4_header(name, kind, p, size, x, &h, err);
    if (st != LLM_OK) return st;
    if (kind == LLM_IMAGE_KIND_Q8 || kind == LLM_IMAGE_KIND_F32M)
        return check_wide_layout(name, kind, p, size, &h, err);
    return kind == LLM_IMAGE_KIND_Q4 ? check_q4_layout(name, p, size, &h, err)
                                     : check_rows_layout(name, p, size, &h, err);
}

/* The converter's choice (image_format.h KIND_WEIGHTS). */
static llm_status check_weights(const char *name, const uint8_t *p, uint32_t size,
                                llm_error *err) {
    llm_image_weights_header h;
    llm_status st = read_header(name, p, size, &h, sizeof h, err);
    if (st != LLM_OK) return st;
    const uint32_t chosen = h.chosen, n = h.n_tried;
    if (n > LLM_IMAGE_WEIGHTS_MAX_TRIED || (chosen == 0) != (n == 0) || h.reserved != 0)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': chosen %lu with %lu formats tried",
                        name, (unsigned long)chosen, (unsigned long)n);
    const uint64_t want = sizeof h + sizeof(llm_image_weights_tried) * (uint64_t)n;
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, %lu records need %llu", name,
                        (unsigned long)size, (unsigned long)n, (unsigned long long)want);
    int seen_chosen = chosen == 0;
    for (uint32_t k = 0; k < n; k++) {
        llm_image_weights_tried r;
        READ_STRUCT(&r, weights_tried_at(p, k));
        const uint32_t kind = r.kind;
        if (kind != LLM_IMAGE_KIND_Q4 && kind != LLM_IMAGE_KIND_Q8 && kind != LLM_IMAGE_KIND_F32M)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': record %lu names kind %lu", name,
                            (unsigned long)k, (unsigned long)kind);
        for (uint32_t j = 0; j < k; j++) {
            llm_image_weights_tried before;
            READ_STRUCT(&before, weights_tried_at(p, j));
            if (before.kind == kind)
                return llm_fail(err, LLM_E_FORMAT, "section '%s': kind %lu tried twice", name,
                                (unsigned long)kind);
        }
        if (!f32_bits_finite(llm_f32_bits(r.agreement)) ||
            !f32_bits_finite(llm_f32_bits(r.mean_abs_diff)))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': record %lu is NaN or Inf", name,
                            (unsigned long)k);
        seen_chosen |= kind == chosen;
    }
    if (!seen_chosen)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': the chosen kind %lu was not tried",
                        name, (unsigned long)chosen);
    return LLM_OK;
}

/* Bytes per merge record: (left, right, merged) u16, and sentencepiece's
 * u16 rank after all of them. */
static uint64_t merge_bytes(uint32_t flags) { return flags ? 8u : 6u; }

/* Byte-level BPE: whether one of the special ids' text is "<|endoftext|>"
 * (what ends a story; the board's tokenizer finds the id by it). texts:
 * the token texts, lengths[i] bytes each, in id order. */
static int has_eot_special(const uint8_t *ids, uint32_t n_special, const uint8_t *lengths,
                           const uint8_t *texts) {
    static const char eot[] = "<|endoftext|>";
    for (uint32_t k = 0; k < n_special; k++) {
        const uint16_t id = rd16(ids + 2u * k);
        uint64_t off = 0;
        for (uint32_t i = 0; i < id; i++) off += lengths[i];
        if (lengths[id] == sizeof eot - 1u && memcmp(texts + off, eot, sizeof eot - 1u) == 0)
            return 1;
    }
    return 0;
}

/* A KIND_TOKENIZER payload, rule by rule in a fixed order with fixed
 * messages: firmware/modules/llm_tokenizer.py's check_section is its twin
 * (the same rules, order and words, so an image one reader accepts the other
 * accepts; tests/test_tokenizer_section_agrees.py holds them equal). */
static llm_status check_tokenizer(const char *name, const uint8_t *p, uint32_t size,
                                  const llm_config *c, llm_error *err) {
    llm_image_tokenizer_header h;
    llm_status st = read_header(name, p, size, &h, sizeof h, err);
    if (st != LLM_OK) return st;
    uint32_t n_vocab = h.n_vocab, n_merges = h.n_merges, n_special = h.n_special;
    if (n_vocab != c->vocab_out)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': n_vocab %lu != vocab_out %lu", name,
                        (unsigned long)n_vocab, (unsigned long)c->vocab_out);
    /* ids are u16 (merges, specials, the byte table) */
    if (n_vocab == 0 || n_vocab > 65536u)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': n_vocab %lu out of range 1..65536",
                        name, (unsigned long)n_vocab);
    /* flags: bit 0 = llama2.c's sentencepiece rules (a rank per merge follows
     * the merges); image_format.h, KIND_TOKENIZER */
    const uint32_t flags = h.flags;
    if (flags & ~1u)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': unknown flags %#lx (newer format?)",
                        name, (unsigned long)flags);
    if (n_special == 0)
        return llm_fail(err, LLM_E_FORMAT,
                        "section '%s': no special tokens (needs an end-of-text id)", name);
    for (uint32_t b = 0; b < 256; b++) {
        uint16_t id = h.byte_ids[b];
        if (id != 0xFFFFu && id >= n_vocab)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': byte %lu maps to id %u >= n_vocab "
                            "%lu", name, (unsigned long)b, id, (unsigned long)n_vocab);
    }
    const uint64_t specials = sizeof h;
    uint64_t at = specials;
    if ((uint64_t)n_special * 2u > size - at)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': special ids run past the end", name);
    for (uint32_t k = 0; k < n_special; k++)
        if (rd16(p + at + 2 * k) >= n_vocab)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': special id %u >= n_vocab %lu", name,
                            rd16(p + at + 2 * k), (unsigned long)n_vocab);
    if (flags && n_special < 2u)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': sentencepiece needs BOS and EOS ids",
                        name);
    at += (uint64_t)n_special * 2u;
    at = (at + 3u) / 4u * 4u;
    if (at > size || n_vocab > size - at)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': token lengths run past the end", name);
    const uint8_t *lengths = p + at;
    uint64_t text = 0;
    for (uint32_t k = 0; k < n_vocab; k++) {
        /* an empty token could never be encoded nor end a merge */
        if (lengths[k] == 0)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': token %lu has no text", name,
                            (unsigned long)k);
        text += lengths[k];
    }
    at += n_vocab;
    const uint64_t texts = at;
    if (text > size - at)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': token texts run past the end", name);
    at += text;
    at = (at + 1u) / 2u * 2u;
    if (at > size || (uint64_t)n_merges * merge_bytes(flags) != size - at)
        return llm_fail(err, LLM_E_FORMAT,
                        "section '%s': %lu merges need %llu bytes after the texts, %llu remain",
                        name, (unsigned long)n_merges,
                        (unsigned long long)n_merges * merge_bytes(flags),
                        (unsigned long long)(at > size ? 0 : size - at));
    if (!flags && !has_eot_special(p + specials, n_special, lengths, p + texts))
        return llm_fail(err, LLM_E_FORMAT, "section '%s': no special token is <|endoftext|>",
                        name);
    for (uint64_t k = 0; k < (uint64_t)n_merges * 3u; k++)
        if (rd16(p + at + 2 * k) >= n_vocab)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': merge %llu uses id %u >= n_vocab "
                            "%lu", name, (unsigned long long)(k / 3), rd16(p + at + 2 * k),
                            (unsigned long)n_vocab);
    return LLM_OK;
}

static int all_zero(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* Sizes, scales and padding of a head_tiles payload. That the order is a
 * permutation and that every weight lies in its tile's box is checked by
 * llm_open, which has the memory and touches the head rows anyway. */
static llm_status check_tiles(const char *name, const uint8_t *p, uint32_t size, const expect *x,
                              llm_error *err) {
    llm_image_tiles_header h;
    llm_status st = read_header(name, p, size, &h, sizeof h, err);
    if (st != LLM_OK) return st;
    const uint32_t cp = ceil_div(x->cols, LLM_IMAGE_BLOCK_COLS) * LLM_IMAGE_BLOCK_COLS;
    if (h.rows != x->rows || h.cols_padded != cp)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': [%lu rows, %lu cols], the head is "
                        "[%lu, %lu]", name, (unsigned long)h.rows, (unsigned long)h.cols_padded,
                        (unsigned long)x->rows, (unsigned long)cp);
    if (h.n_tiles == 0) {
        if (size != sizeof h)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': no tiles but %lu bytes", name,
                            (unsigned long)size);
        return LLM_OK;
    }
    if (h.rows > 65536u || cp > LLM_IMAGE_TILES_MAX_COLS)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': tiles need rows <= 65536 and "
                        "cols_padded <= %u", name, (unsigned)LLM_IMAGE_TILES_MAX_COLS);
    if (h.tile_rows == 0 || h.tile_rows > LLM_IMAGE_TILES_MAX_ROWS ||
        h.n_tiles != ceil_div(h.rows, h.tile_rows))
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu tiles of %lu rows (at most %u) "
                        "do not cover %lu rows", name, (unsigned long)h.n_tiles, (unsigned long)h.tile_rows,
                        (unsigned)LLM_IMAGE_TILES_MAX_ROWS, (unsigned long)h.rows);
    const uint64_t order_bytes = llm_align_up((uint64_t)2u * h.rows, LLM_IMAGE_ALIGN);
    const uint64_t scale_bytes = llm_align_up((uint64_t)4u * h.n_tiles, LLM_IMAGE_ALIGN);
    const uint64_t want = sizeof h + order_bytes + scale_bytes + (uint64_t)h.n_tiles * 2u * cp;
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, layout needs %llu", name,
                        (unsigned long)size, (unsigned long long)want);
    const uint8_t *sc = p + sizeof h + order_bytes;
    if (!all_zero(p + sizeof h + 2u * (uint64_t)h.rows, order_bytes - 2u * (uint64_t)h.rows) ||
        !all_zero(sc + 4u * (uint64_t)h.n_tiles, scale_bytes - 4u * (uint64_t)h.n_tiles))
        return llm_fail(err, LLM_E_FORMAT, "section '%s': padding is not zero", name);
    for (uint32_t t = 0; t < h.n_tiles; t++) {
        uint32_t bits = rd32(sc + 4u * t);
        uint32_t exponent = (bits >> 23) & 0xFFu;
        /* a positive normal power of two: (mid +- half) * scale is then exact */
        if ((bits & 0x807FFFFFu) != 0 || exponent == 0 || exponent == 0xFFu)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': tile %lu scale 0x%08lx is not a "
                            "positive normal power of two", name, (unsigned long)t,
                            (unsigned long)bits);
        const int8_t *mid = (const int8_t *)(const void *)(sc + scale_bytes + (uint64_t)t * 2u * cp);
        const int8_t *half = mid + cp;
        for (uint32_t j = 0; j < cp; j++) {
            if (half[j] < 0)
                return llm_fail(err, LLM_E_FORMAT, "section '%s': tile %lu column %lu has a "
                                "negative half-range", name, (unsigned long)t, (unsigned long)j);
            if (j >= x->cols && (mid[j] != 0 || half[j] != 0))
                return llm_fail(err, LLM_E_FORMAT, "section '%s': tile %lu padded column %lu "
                                "is not zero", name, (unsigned long)t, (unsigned long)j);
        }
    }
    return LLM_OK;
}

/* Sizes, order, ids and padding of a drafts payload (image_format.h). */
static llm_status check_drafts(const char *name, const uint8_t *p, uint32_t size,
                               const expect *x, llm_error *err) {
    llm_image_drafts_header h;
    llm_status st = read_header(name, p, size, &h, sizeof h, err);
    if (st != LLM_OK) return st;
    const uint32_t max_draft = h.max_draft;
    if (max_draft > LLM_IMAGE_DRAFTS_MAX)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': max_draft %lu exceeds %u", name,
                        (unsigned long)max_draft, (unsigned)LLM_IMAGE_DRAFTS_MAX);
    for (uint32_t k = max_draft; k <= LLM_IMAGE_DRAFTS_MAX; k++)
        if (h.min_odds[k] != 0)
            return llm_fail(err, LLM_E_FORMAT, "section '%s': min_odds[%lu] past max_draft is "
                            "not zero", name, (unsigned long)k);
    uint64_t want = sizeof h;
    for (uint32_t n = 1; n <= LLM_IMAGE_DRAFTS_ORDER; n++) {
        const uint64_t records = h.contexts[n - 1];
        if (records > ((uint64_t)size + 1u))  /* keeps the sums below far from overflow */
            return llm_fail(err, LLM_E_FORMAT, "section '%s': %llu records do not fit", name,
                            (unsigned long long)records);
        want += drafts_table_bytes(n, records);
    }
    if ((uint64_t)size != want)
        return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu bytes, layout needs %llu", name,
                        (unsigned long)size, (unsigned long long)want);
    const uint8_t *q = p + sizeof h;
    for (uint32_t n = 1; n <= LLM_IMAGE_DRAFTS_ORDER; n++) {
        const uint32_t records = h.contexts[n - 1];
        const uint32_t stride = 2u * (n + 2u);
        for (uint32_t r = 0; r < records; r++) {
            const uint8_t *rec = q + (size_t)r * stride;
            for (uint32_t j = 0; j < n + 1u; j++) {
                uint32_t id = (uint32_t)(rec[2 * j] | (rec[2 * j + 1] << 8));
                if (id >= x->rows)
                    return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu-token record %lu "
                                    "holds token %lu, the vocabulary has %lu", name,
                                    (unsigned long)n, (unsigned long)r, (unsigned long)id,
                                    (unsigned long)x->rows);
            }
            if ((rec[2 * n + 2] | rec[2 * n + 3]) == 0)
                return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu-token record %lu has "
                                "share 0", name, (unsigned long)n, (unsigned long)r);
            if (r > 0) {
                /* little-endian u16s compared most significant token first */
                const uint8_t *prev = rec - stride;
                int order = 0;
                for (uint32_t j = 0; j < n && order == 0; j++) {
                    uint32_t a = (uint32_t)(prev[2 * j] | (prev[2 * j + 1] << 8));
                    uint32_t b = (uint32_t)(rec[2 * j] | (rec[2 * j + 1] << 8));
                    order = a < b ? -1 : a > b ? 1 : 0;
                }
                if (order >= 0)
                    return llm_fail(err, LLM_E_FORMAT, "section '%s': %lu-token record %lu is "
                                    "not after record %lu", name, (unsigned long)n,
                                    (unsigned long)r, (unsigned long)(r - 1));
            }
        }
        const size_t used = (size_t)records * stride;
        const size_t bytes = (size_t)drafts_table_bytes(n, records);
        if (!all_zero(q + used, bytes - used))
            return llm_fail(err, LLM_E_FORMAT, "section '%s': padding is not zero", name);
        q += bytes;
    }
    return LLM_OK;
}

/* ---- the whole image --------------------------------------------------- */

/* The header's fields, read through llm_image_header in this one place: a
 * copy of its bytes. The engine reads the image's little-endian numbers in
 * place anyway, so only a little-endian host opens an image (check_host). */
static void header_read(const uint8_t *data, llm_image_header *h) { memcpy(h, data, sizeof *h); }

llm_status llm_image_claimed_size(const uint8_t *head, size_t len, uint32_t *file_bytes,
                                  llm_error *err) {
    if (len < LLM_IMAGE_HEADER_BYTES)
        return llm_fail(err, LLM_E_FORMAT, "image is %lu bytes, shorter than its %u-byte header",
                        (unsigned long)len, (unsigned)LLM_IMAGE_HEADER_BYTES);
    llm_image_header h;
    header_read(head, &h);
    if (memcmp(h.magic, LLM_IMAGE_MAGIC, sizeof h.magic) != 0)
        return llm_fail(err, LLM_E_FORMAT, "bad magic: not an mpllm image (convert model.bin "
                                           "with mpllm-convert first)");
    if (h.version != LLM_IMAGE_VERSION)
        return llm_fail(err, LLM_E_VERSION,
                        "image format version %lu; this engine reads %u: convert the model again",
                        (unsigned long)h.version, (unsigned)LLM_IMAGE_VERSION);
    if (h.header_bytes != LLM_IMAGE_HEADER_BYTES)
        return llm_fail(err, LLM_E_FORMAT, "header_bytes is %lu, this format version has %u",
                        (unsigned long)h.header_bytes, (unsigned)LLM_IMAGE_HEADER_BYTES);
    *file_bytes = h.file_bytes;
    if (*file_bytes < LLM_IMAGE_HEADER_BYTES)
        return llm_fail(err, LLM_E_FORMAT, "the header says the image is %lu bytes, shorter "
                        "than the header", (unsigned long)*file_bytes);
    return LLM_OK;
}

/* What the host must offer before a byte is read: a pointer, 16-byte
 * alignment, little-endian numbers. */
static llm_status check_host(const uint8_t *data, llm_error *err) {
    if (data == NULL)
        return llm_fail(err, LLM_E_ARG, "image pointer is NULL");
    if (((uintptr_t)data & (LLM_IMAGE_ALIGN - 1)) != 0)
        return llm_fail(err, LLM_E_ARG, "image must start 16-byte aligned");
    /* The engine reads f32/u32 in place: only a little-endian host can. */
    const uint16_t probe = 1;
    uint8_t first;
    memcpy(&first, &probe, 1);
    if (first != 1)
        return llm_fail(err, LLM_E_CONFIG, "big-endian hosts are not supported");
    return LLM_OK;
}

/* The header and the section table around it: the size it claims, the
 * table's bounds, its CRC (over header and table, the CRC field read as
 * zero), flags and reserved bytes. */
static llm_status check_header(const uint8_t *data, size_t len, llm_image_header *h,
                               llm_error *err) {
    uint32_t file_bytes;
    llm_status st = llm_image_claimed_size(data, len, &file_bytes, err);
    if (st != LLM_OK) return st;
    if ((uint64_t)file_bytes != (uint64_t)len)
        return llm_fail(err, LLM_E_FORMAT,
                        "image is %lu bytes but its header says %lu (truncated or padded)",
                        (unsigned long)len, (unsigned long)file_bytes);
    header_read(data, h);
    if (h->n_sections == 0 || h->n_sections > LLM_IMAGE_MAX_SECTIONS)
        return llm_fail(err, LLM_E_FORMAT, "n_sections %lu is not in 1..%u",
                        (unsigned long)h->n_sections, (unsigned)LLM_IMAGE_MAX_SECTIONS);
    const uint64_t table_end =
        LLM_IMAGE_HEADER_BYTES + (uint64_t)h->n_sections * LLM_IMAGE_SECTION_BYTES;
    if (table_end > len)
        return llm_fail(err, LLM_E_FORMAT, "section table (%lu entries) runs past the image end",
                        (unsigned long)h->n_sections);
    static const uint8_t zero[sizeof h->header_crc32] = {0};
    const size_t at_crc = offsetof(llm_image_header, header_crc32), after = at_crc + sizeof zero;
    uint32_t crc = llm_crc32(0, data, at_crc);
    crc = llm_crc32(crc, zero, sizeof zero);
    crc = llm_crc32(crc, data + after, (size_t)(table_end - after));
    if (crc != h->header_crc32) {
#if !defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
        return llm_fail(err, LLM_E_CHECKSUM,
                        "header/section-table CRC-32 is 0x%08lx, header says 0x%08lx "
                        "(image corrupted)",
                        (unsigned long)crc, (unsigned long)h->header_crc32);
#endif
    }
    if (h->flags & ~(uint32_t)LLM_IMAGE_FLAGS_KNOWN)
        return llm_fail(err, LLM_E_FORMAT, "unknown flag bits 0x%lx (image from a newer converter?)",
                        (unsigned long)(h->flags & ~(uint32_t)LLM_IMAGE_FLAGS_KNOWN));
    if (h->reserved != 0)
        return llm_fail(err, LLM_E_FORMAT, "header reserved field is 0x%08lx, must be 0",
                        (unsigned long)h->reserved);
    return LLM_OK;
}

/* The model's config from the header, checked, and the section count it
 * implies. */
static llm_status config_from_header(const llm_image_header *h, llm_config *c, llm_error *err) {
#define FROM_HEADER(field) c->field = h->field;
    FROM_HEADER(flags) FROM_HEADER(vocab_rows) FROM_HEADER(vocab_out) FROM_HEADER(dim)
    FROM_HEADER(n_layers) FROM_HEADER(n_heads) FROM_HEADER(ffn) FROM_HEADER(ple_dim)
    FROM_HEADER(seq_len) FROM_HEADER(group) FROM_HEADER(rope_theta) FROM_HEADER(eot_id)
    FROM_HEADER(arch) FROM_HEADER(n_kv_heads) FROM_HEADER(norm_eps)
#undef FROM_HEADER
    c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    c->kv_dim = c->n_kv_heads * c->head_dim; /* <= dim once checked */
    llm_status st = check_config(c, err);
    if (st != LLM_OK) return st;
    if (c->vocab_rows > h->vocab_in_source)
        return llm_fail(err, LLM_E_CONFIG, "vocab_rows %lu exceeds vocab_in_source %lu",
                        (unsigned long)c->vocab_rows, (unsigned long)h->vocab_in_source);
    const int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    const uint32_t want_sections = llm_image_section_count(c);
    if (h->n_sections != want_sections)
        return llm_fail(err, LLM_E_FORMAT, "%lu sections, a %lu-layer %s-head model has %lu",
                        (unsigned long)h->n_sections, (unsigned long)c->n_layers,
                        tied ? "tied" : "untied", (unsigned long)want_sections);
    return LLM_OK;
}

/* Section i's table entry: the name and kind the spec fixes for index i. */
static llm_status check_entry(const llm_image_section *s, const char *want, const expect *x,
                              uint32_t i, uint32_t arch, llm_error *err) {
    if (memcmp(s->name, want, LLM_IMAGE_NAME_BYTES) != 0) {
        char shown[LLM_IMAGE_NAME_BYTES + 1];
        for (uint32_t k = 0; k < LLM_IMAGE_NAME_BYTES; k++) {
            char ch = s->name[k];
            shown[k] = (ch >= 0x20 && ch < 0x7F) || ch == 0 ? ch : '?';
        }
        shown[LLM_IMAGE_NAME_BYTES] = 0;
        return llm_fail(err, LLM_E_FORMAT, "section %lu is named '%s', expected '%s'",
                        (unsigned long)i, shown, want);
    }
    if (s->kind == x->kind) return LLM_OK;
    if (x->matrix && (s->kind == LLM_IMAGE_KIND_Q8 || s->kind == LLM_IMAGE_KIND_F32M)) {
        if (arch == LLM_ARCH_LLAMA) return LLM_OK;
        return llm_fail(err, LLM_E_FORMAT, "section '%s' has kind %s: an esp32-ai image is Q4 "
                        "throughout", want, kind_name(s->kind));
    }
    return llm_fail(err, LLM_E_FORMAT, "section '%s' has kind %lu (%s), expected %s%s", want,
                    (unsigned long)s->kind, kind_name(s->kind), kind_name(x->kind),
                    x->matrix ? ", Q8 or F32M" : "");
}

/* Section i's place: 16-byte aligned, at the first aligned offset after the
 * previous section (so overlaps and gaps are both errors), inside the image,
 * zero padding before it; then its CRC. */
static llm_status check_place(const llm_image_info *info, const llm_image_section *s,
                              const char *want, uint64_t prev_end, llm_error *err) {
    if (s->offset % LLM_IMAGE_ALIGN != 0)
        return llm_fail(err, LLM_E_FORMAT, "section '%s' offset %lu is not 16-byte aligned",
                        want, (unsigned long)s->offset);
    const uint64_t want_offset = llm_align_up(prev_end, LLM_IMAGE_ALIGN);
    if ((uint64_t)s->offset != want_offset)
        return llm_fail(err, LLM_E_FORMAT,
                        "section '%s' at offset %lu, expected %llu (overlap or gap)", want,
                        (unsigned long)s->offset, (unsigned long long)want_offset);
    if ((uint64_t)s->offset + s->size > info->len)
        return llm_fail(err, LLM_E_FORMAT,
                        "section '%s' [%lu, +%lu) runs past the image end %lu", want,
                        (unsigned long)s->offset, (unsigned long)s->size,
                        (unsigned long)info->len);
    if (!all_zero(info->data + prev_end, s->offset - prev_end))
        return llm_fail(err, LLM_E_FORMAT, "padding before section '%s' is not zero", want);
    const uint32_t crc = llm_crc32(0, info->data + s->offset, s->size);
    if (crc != s->crc32) {
#if !defined(FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
        return llm_fail(err, LLM_E_CHECKSUM,
                        "section '%s' CRC-32 is 0x%08lx, table says 0x%08lx (image corrupted)",
                        want, (unsigned long)crc, (unsigned long)s->crc32);
#endif
    }
    return LLM_OK;
}

/* Section i, whole: its entry, its place, then its kind's inner layout (a
 * checksum before the layout, so corruption is reported as corruption).
 * *prev_end moves to the section's end. */
static llm_status check_section(const llm_image_info *info, uint32_t i, uint64_t *prev_end,
                                llm_error *err) {
    const llm_config *c = &info->config;
    const uint32_t slot = llm_image_index_slot(c, i);
    llm_image_section s;
    char want[LLM_IMAGE_NAME_BYTES];
    section_at(info, i, &s);
    llm_image_section_name(c, slot, want);
    const expect x = section_expect(c, slot);
    llm_status st = check_entry(&s, want, &x, i, c->arch, err);
    if (st == LLM_OK) st = check_place(info, &s, want, *prev_end, err);
    if (st != LLM_OK) return st;
    const uint8_t *p = info->data + s.offset;
    switch (x.kind) {
    case LLM_IMAGE_KIND_F32: st = check_f32(want, p, s.size, x.f32_count, err); break;
    case LLM_IMAGE_KIND_Q4:
    case LLM_IMAGE_KIND_ROWS: st = check_matrix(want, s.kind, p, s.size, &x, err); break;
    case LLM_IMAGE_KIND_WEIGHTS: st = check_weights(want, p, s.size, err); break;
    case LLM_IMAGE_KIND_HEAD_TILES: st = check_tiles(want, p, s.size, &x, err); break;
    case LLM_IMAGE_KIND_DRAFTS: st = check_drafts(want, p, s.size, &x, err); break;
    default: st = check_tokenizer(want, p, s.size, c, err); break;
    }
    *prev_end = (uint64_t)s.offset + s.size;
    return st;
}

/* The certificate's boxes bound int4 codes (head.c): a head of another kind
 * must come without tiles. */
static llm_status check_head_kind(const llm_image_info *info, llm_error *err) {
    const llm_config *c = &info->config;
    const int tied = (c->flags & LLM_IMAGE_FLAG_TIED_HEAD) != 0;
    llm_image_section head, tiles;
    const uint32_t head_slot = tied ? (uint32_t)LLM_SEC_EMBED
                                   : LLM_SEC_LAYER0 + LLM_LSEC_COUNT * c->n_layers + 1u;
    section_at(info, llm_image_slot_index(c, head_slot), &head);
    section_at(info, info->n_sections - FROM_END_TILES, &tiles);
    llm_image_tiles_header t;
    READ_STRUCT(&t, info->data + tiles.offset);
    if (head.kind != LLM_IMAGE_KIND_Q4 && t.n_tiles != 0)
        return llm_fail(err, LLM_E_FORMAT, "section 'head_tiles': a certificate for a %s head "
                        "(only int4 heads are certified)", kind_name(head.kind));
    return LLM_OK;
}

llm_status llm_image_check(const uint8_t *data, size_t len, llm_image_info *info,
                           llm_error *err) {
    memset(info, 0, sizeof *info);
    llm_image_header h;
    llm_status st = check_host(data, err);
    if (st == LLM_OK) st = check_header(data, len, &h, err);
    if (st == LLM_OK) st = config_from_header(&h, &info->config, err);
    if (st != LLM_OK) return st;
    info->data = data;
    info->len = len;
    info->n_sections = h.n_sections;
    uint64_t prev_end = LLM_IMAGE_HEADER_BYTES + (uint64_t)h.n_sections * LLM_IMAGE_SECTION_BYTES;
    for (uint32_t i = 0; i < h.n_sections && st == LLM_OK; i++)
        st = check_section(info, i, &prev_end, err);
    if (st == LLM_OK && prev_end != len)
        st = llm_fail(err, LLM_E_FORMAT, "%llu bytes after the last section",
                      (unsigned long long)(len - prev_end));
    if (st == LLM_OK) st = check_head_kind(info, err);
    if (st != LLM_OK) info->data = NULL;
    return st;
}
