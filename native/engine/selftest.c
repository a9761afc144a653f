/*
 * Self-test: PIE kernels vs references, silicon probes, float probes
 * (see selftest.h for the output format).
 */
#include "selftest.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "align_up.h"
#include "f32_bits.h"
#include "kernels.h"
#include "pie.h"

typedef struct ctx {
    llm_selftest_print_fn print;
    void *user;
    int failures, differences;
    uint32_t rng;
} ctx;

static void say(ctx *c, const char *line) { c->print(c->user, line); }

static uint32_t next(ctx *c) { /* xorshift32: fixed seeds, same on every platform */
    uint32_t x = c->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return c->rng = x;
}

static void verdict(ctx *c, int ok, const char *kernel, const char *what) {
    char line[96];
    snprintf(line, sizeof line, "%s %s %s", ok ? "PASS" : "FAIL", kernel, what);
    say(c, line);
    if (!ok) c->failures++;
}

#define MAX_ROWS 16u
#define MAX_COLS 256u

/* One matvec case: random codes in the packed layout, random activations
 * quantized by llm_quantize_act, full call and a split call vs the ref. */
static void matvec_case(ctx *c, uint32_t rows, uint32_t cols, uint32_t group, uint32_t seed,
                        int extreme) {
    _Alignas(16) uint8_t codes[MAX_ROWS * MAX_COLS / 2];
    _Alignas(16) int8_t xq[MAX_COLS];
    float x[MAX_COLS], scales[MAX_ROWS * (MAX_COLS / 32)], yr[MAX_ROWS], yp[MAX_ROWS];
    const uint32_t cp = (uint32_t)llm_align_up(cols, 32u), row_bytes = cp / 2u;
    const uint32_t n_groups = (cols + group - 1u) / group;
    c->rng = seed;
    memset(codes, 0, sizeof codes);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < cp; j++) {
            uint32_t code = j >= cols ? 8u : extreme ? ((r + j) & 1u ? 15u : 0u) : next(c) & 15u;
            uint8_t *byte = codes + r * row_bytes + 16u * (j / 32u) + (j % 16u);
            *byte = (uint8_t)((j % 32u) < 16u ? (*byte & 0xF0u) | code
                                              : (*byte & 0x0Fu) | code << 4);
        }
    for (uint32_t i = 0; i < rows * n_groups; i++)
        scales[i] = (float)((int32_t)(next(c) % 2001u) - 1000) * 3.0517578e-05f;
    for (uint32_t j = 0; j < cols; j++)
        x[j] = extreme ? (j & 1u ? -4.f : 4.f) : (float)((int32_t)(next(c) % 20001u) - 10000) * 1e-3f;
    float xscale;
    llm_quantize_act(x, cols, cp, xq, &xscale);
    const llm_q4 w = {.codes = codes, .scales = scales, .rows = rows, .cols = cols,
                      .group = group, .n_groups = n_groups, .row_bytes = row_bytes};
    llm_matvec_q4_ref(&w, xq, xscale, yr, 0, rows);
    memset(yp, 0xA5, sizeof yp);
    llm_matvec_q4_pie(&w, xq, xscale, yp, 0, rows / 3u);
    llm_matvec_q4_pie(&w, xq, xscale, yp, rows / 3u, rows);
    char what[64];
    snprintf(what, sizeof what, "%ux%u group %u%s", (unsigned)rows, (unsigned)cols,
             (unsigned)group, extreme ? " extreme" : "");
    verdict(c, memcmp(yr, yp, rows * sizeof(float)) == 0, "matvec_q4_pie", what);
    /* the same rows against three activation vectors at once: this one, its
     * negation and it shifted by one column (each column vs the ref) */
    _Alignas(16) int8_t x3[3 * MAX_COLS];
    float s3[3] = {xscale, xscale, xscale}, y3[3 * MAX_ROWS];
    for (uint32_t j = 0; j < cp; j++) {
        x3[j] = xq[j];
        x3[cp + j] = (int8_t)-xq[j];
        x3[2u * cp + j] = j + 1u < cols ? xq[j + 1u] : 0;
    }
    const int8_t *xp[3] = {x3, x3 + cp, x3 + 2u * cp};
    float *yp3[3] = {y3, y3 + rows, y3 + 2u * rows};
    llm_matvec_q4_cols_pie(&w, xp, s3, 3, yp3, 0, rows);
    int same = 1;
    for (uint32_t k = 0; k < 3u; k++) {
        llm_matvec_q4_ref(&w, x3 + k * cp, xscale, yr, 0, rows);
        same &= memcmp(yr, y3 + k * rows, rows * sizeof(float)) == 0;
    }
    verdict(c, same, "matvec_q4_cols_pie", what);
}

/* One int8 (Q8_0) case: random codes (+-127 when extreme) and scales, an
 * input quantized in the same groups; the PIE kernel (full and split) and the
 * many-columns one (the input and its negation) against the reference. */
static void q8_case(ctx *c, uint32_t rows, uint32_t cols, uint32_t group, uint32_t seed,
                    int extreme) {
    _Alignas(16) int8_t codes[MAX_ROWS * MAX_COLS];
    _Alignas(16) int8_t xq[2 * MAX_COLS];
    float x[MAX_COLS], scales[MAX_ROWS * (MAX_COLS / 32)], xs[2 * (MAX_COLS / 32)];
    float yr[MAX_ROWS], yp[2 * MAX_ROWS];
    const uint32_t cp = (uint32_t)llm_align_up(cols, 32u);
    const uint32_t n_groups = (cols + group - 1u) / group;
    c->rng = seed;
    memset(codes, 0, sizeof codes);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < cols; j++)
            codes[r * cp + j] = extreme ? (int8_t)((r + j) & 1u ? 127 : -127)
                                        : (int8_t)((int32_t)(next(c) % 255u) - 127);
    for (uint32_t i = 0; i < rows * n_groups; i++)
        scales[i] = (float)((int32_t)(next(c) % 2001u) - 1000) * 3.0517578e-05f;
    for (uint32_t j = 0; j < cols; j++)
        x[j] = extreme ? (j & 1u ? -4.f : 4.f) : (float)((int32_t)(next(c) % 20001u) - 10000) * 1e-3f;
    llm_quantize_act_groups(x, cols, group, cp, xq, xs);
    for (uint32_t j = 0; j < cp; j++) xq[cp + j] = (int8_t)-xq[j];
    for (uint32_t g = 0; g < n_groups; g++) xs[n_groups + g] = xs[g];
    const llm_q8 w = {codes, scales, rows, cols, group, n_groups, cp};
    char what[64];
    snprintf(what, sizeof what, "%ux%u group %u%s", (unsigned)rows, (unsigned)cols,
             (unsigned)group, extreme ? " extreme" : "");
    llm_matvec_q8_ref(&w, xq, xs, yr, 0, rows);
    memset(yp, 0xA5, sizeof yp);
    llm_matvec_q8_pie(&w, xq, xs, yp, 0, rows / 3u);
    llm_matvec_q8_pie(&w, xq, xs, yp, rows / 3u, rows);
    int same = memcmp(yr, yp, rows * sizeof(float)) == 0;
    const int8_t *xp[2] = {xq, xq + cp};
    const float *sp[2] = {xs, xs + n_groups};
    float *y2[2] = {yp, yp + rows};
    llm_matvec_q8_cols_pie(&w, xp, sp, 2, y2, 0, rows);
    for (uint32_t k = 0; k < 2u; k++) {
        llm_matvec_q8_ref(&w, xp[k], sp[k], yr, 0, rows);
        same &= memcmp(yr, y2[k], rows * sizeof(float)) == 0;
    }
    verdict(c, same, "matvec_q8_pie", what);
}

/* One fp32 case: the scalar-FPU flavour against the lane-array reference. */
static void f32_case(ctx *c, uint32_t rows, uint32_t cols, uint32_t seed) {
    float wv[MAX_ROWS * MAX_COLS], x[MAX_COLS], yr[MAX_ROWS], yp[MAX_ROWS];
    const uint32_t rf = (uint32_t)llm_align_up(cols, 4u);
    c->rng = seed;
    memset(wv, 0, sizeof wv);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < cols; j++)
            wv[r * rf + j] = (float)((int32_t)(next(c) % 20001u) - 10000) * 1e-4f;
    for (uint32_t j = 0; j < cols; j++) x[j] = (float)((int32_t)(next(c) % 20001u) - 10000) * 1e-3f;
    const llm_f32m w = {wv, rows, cols, rf};
    llm_matvec_f32_ref(&w, x, yr, 0, rows);
    memset(yp, 0xA5, sizeof yp);
    llm_matvec_f32_pie(&w, x, yp, 0, rows);
    char what[48];
    snprintf(what, sizeof what, "%ux%u", (unsigned)rows, (unsigned)cols);
    verdict(c, memcmp(yr, yp, rows * sizeof(float)) == 0, "matvec_f32_pie", what);
}

static void dot_case(ctx *c, uint32_t n, uint32_t seed, int extreme) {
    /* three rows of n, so every row after the first starts n bytes on */
    _Alignas(16) int8_t a[3 * 256], b[256];
    int32_t yr[3], yp[3];
    c->rng = seed;
    for (uint32_t i = 0; i < 3u * n; i++) a[i] = extreme ? (int8_t)-128 : (int8_t)(next(c) & 0xFFu);
    for (uint32_t i = 0; i < n; i++) b[i] = extreme ? (int8_t)-128 : (int8_t)(next(c) & 0xFFu);
    llm_matvec_s8_ref(a, 3, n, b, yr);
    llm_matvec_s8_pie(a, 3, n, b, yp);
    char what[48];
    snprintf(what, sizeof what, "3x%u%s", (unsigned)n, extreme ? " extreme" : "");
    verdict(c, memcmp(yr, yp, sizeof yr) == 0, "matvec_s8_pie", what);
}

static void probe(ctx *c, const char *name, uint32_t got, uint32_t model) {
    char line[128];
    snprintf(line, sizeof line, "PROBE %s got=0x%08lx model=0x%08lx %s", name,
             (unsigned long)got, (unsigned long)model, got == model ? "SAME" : "DIFFERS");
    say(c, line);
    if (got != model) c->differences++;
}

/* ACCX <- v through wur (bits 39:32 from the low byte of the second word). */
static void accx_set(uint32_t hi8, uint32_t lo32) {
    WUR_ACCX_0(lo32);
    WUR_ACCX_1(hi8);
}

/* q<Q> <- 16 copies of the int8 x, through the 16-byte aligned staging
 * buffer v (Q is a register number: an immediate of the instruction). */
#define LOAD_SPLAT(v, Q, x)           \
    do {                              \
        const int8_t *splat_ = (v);   \
        memset((v), (x), 16);         \
        EE_VLD_128_IP(Q, splat_, 0);  \
    } while (0)

/* Reads ACCX back and probes its two words: "<what>_accx_1" is bits 39:32
 * (rur.accx_1's low byte), "<what>_accx_0" bits 31:0. */
static void probe_accx(ctx *c, const char *what, uint32_t model_hi8, uint32_t model_lo) {
    uint32_t lo, hi;
    RUR_ACCX_1(hi);
    RUR_ACCX_0(lo);
    char name[64];
    snprintf(name, sizeof name, "%s_accx_1", what);
    probe(c, name, hi & 0xFFu, model_hi8);
    snprintf(name, sizeof name, "%s_accx_0", what);
    probe(c, name, lo, model_lo);
}

/* The "model" values below are what pie_model.c computes for the same
 * instruction sequence (the host run checks that: there got == model). */
static void silicon_probes(ctx *c) {
    _Alignas(16) int8_t v[16];
    uint32_t lo, hi;
    int32_t s;

    /* ACCX = -16 from a MAC: what fills rur.accx_1's upper 24 bits? */
    LOAD_SPLAT(v, 0, 1);
    LOAD_SPLAT(v, 1, -1);
    EE_ZERO_ACCX();
    EE_VMULAS_S8_ACCX(0, 1);
    NOP();
    NOP();
    RUR_ACCX_1(hi);
    probe(c, "rur.accx_1_after_accx=-16", hi, 0xFFFFFFFFu);
    RUR_ACCX_0(lo);
    probe(c, "rur.accx_0_after_accx=-16", lo, 0xFFFFFFF0u);

    /* srs.accx of 2^38 by 0: saturated (0x7fffffff) or truncated (0)? */
    accx_set(0x40u, 0u);
    EE_SRS_ACCX(s, 0, 0);
    probe(c, "srs.accx_2^38_by_0", (uint32_t)s, 0x7FFFFFFFu);
    accx_set(0xC0u, 0u); /* -2^38 */
    EE_SRS_ACCX(s, 0, 0);
    probe(c, "srs.accx_-2^38_by_0", (uint32_t)s, 0x80000000u);
    accx_set(0xFFu, 0xFFFFFFF9u); /* -7 */
    EE_SRS_ACCX(s, 1, 0);
    probe(c, "srs.accx_-7_by_1_(floor)", (uint32_t)s, 0xFFFFFFFCu);
    RUR_ACCX_0(lo);
    probe(c, "srs.accx_writes_back_accx_0", lo, 0xFFFFFFFCu);
    accx_set(0x12u, 0x345678F0u);
    EE_SRS_ACCX(s, 4, 0);
    probe_accx(c, "srs.accx_0x12345678f0_by_4", 0x01u, 0x2345678Fu);

    /* ACCX rails: 2^39-1-100 + 16*127*127, -2^39+100 + 16*127*(-128) */
    LOAD_SPLAT(v, 2, 127);
    LOAD_SPLAT(v, 3, -128);
    accx_set(0x7Fu, 0xFFFFFF9Bu);
    EE_VMULAS_S8_ACCX(2, 2);
    NOP();
    NOP();
    probe_accx(c, "accx_positive_rail", 0x7Fu, 0xFFFFFFFFu);
    accx_set(0x80u, 0x00000064u);
    EE_VMULAS_S8_ACCX(2, 3);
    NOP();
    NOP();
    probe_accx(c, "accx_negative_rail", 0x80u, 0x00000000u);

    /* vmul.s8: 100*100 = 0x2710 with SAR 0: truncated 0x10 or saturated 0x7f */
    LOAD_SPLAT(v, 4, 100);
    LOAD_SPLAT(v, 5, -100);
    SSAI(0);
    EE_VMUL_S8(6, 4, 4);
    EE_MOVI_32_A(6, lo, 0);
    probe(c, "vmul.s8_100*100_sar0_lane0-3", lo, 0x10101010u);
    SSAI(4);
    EE_VMUL_S8(6, 4, 5);
    EE_MOVI_32_A(6, lo, 0);
    probe(c, "vmul.s8_100*-100_sar4_lane0-3", lo, 0x8F8F8F8Fu);

    /* vadds.s8 negative rail: -100 + -100 -> 0x80 (TRM) or 0x81 (QEMU) */
    EE_VADDS_S8(6, 5, 5);
    EE_MOVI_32_A(6, lo, 0);
    probe(c, "vadds.s8_-100+-100", lo, 0x80808080u);
}

/* Inputs and IEEE-754 binary32 round-to-nearest-even results as bit
 * patterns; tests/test_board_selftest.py recomputes every expect with numpy. */
static const struct {
    char op;
    uint32_t a, b, expect;
} float_probes[] = {
    {'+', 0x3dcccccdu, 0x3e4ccccdu, 0x3e99999au}, /* 0.1f + 0.2f */
    {'+', 0x4b800000u, 0x3f800000u, 0x4b800000u}, /* 2^24 + 1: tie to even */
    {'+', 0x3f800000u, 0x33800000u, 0x3f800000u}, /* 1 + 2^-24: tie to even */
    {'-', 0x3f800001u, 0x3f800000u, 0x34000000u}, /* exact cancellation */
    {'*', 0x3f8ccccdu, 0x3f8ccccdu, 0x3f9ae148u}, /* 1.1f * 1.1f */
    {'*', 0x1e3ce508u, 0x1e3ce508u, 0x000116c2u}, /* 1e-20f^2: subnormal result */
    {'*', 0x7f61b1e6u, 0x41200000u, 0x7f800000u}, /* 3e38f * 10: overflow */
    {'/', 0x3f800000u, 0x40400000u, 0x3eaaaaabu}, /* 1 / 3 */
    {'/', 0x40000000u, 0x40e00000u, 0x3e924925u}, /* 2 / 7 */
    {'/', 0x0da24260u, 0x501502f9u, 0x000116c2u}, /* 1e-30f / 1e10f: subnormal */
    {'/', 0x42fe0000u, 0x3c4985f0u, 0x462154d0u}, /* 127 / 0.0123f (quantizer) */
    {'s', 0x40000000u, 0, 0x3fb504f3u},           /* sqrtf(2) */
    {'s', 0x3f000000u, 0, 0x3f3504f3u},           /* sqrtf(0.5) */
    {'s', 0x000116c2u, 0, 0x1e3ce4e7u},           /* sqrtf(subnormal) */
};

static void float_probe_all(ctx *c) {
    for (size_t i = 0; i < sizeof float_probes / sizeof float_probes[0]; i++) {
        /* volatile: computed at run time by the FPU, never folded */
        volatile float a = llm_f32_from_bits(float_probes[i].a), b = llm_f32_from_bits(float_probes[i].b);
        float r;
        switch (float_probes[i].op) {
        case '+': r = a + b; break;
        case '-': r = a - b; break;
        case '*': r = a * b; break;
        case '/': r = a / b; break;
        default: r = sqrtf(a); break;
        }
        const uint32_t got = llm_f32_bits(r);
        char line[128];
        snprintf(line, sizeof line, "FLOAT %c a=0x%08lx b=0x%08lx got=0x%08lx expect=0x%08lx %s",
                 float_probes[i].op, (unsigned long)float_probes[i].a,
                 (unsigned long)float_probes[i].b, (unsigned long)got,
                 (unsigned long)float_probes[i].expect,
                 got == float_probes[i].expect ? "SAME" : "DIFFERS");
        say(c, line);
        if (got != float_probes[i].expect) c->failures++;
    }
}

int llm_selftest_run(llm_selftest_print_fn print, void *user) {
    ctx c = {.print = print, .user = user, .rng = 1};
    say(&c, "selftest kernels=" LLM_PIE_FLAVOUR);
    matvec_case(&c, 16, 96, 128, 0x1234567u, 0);   /* the model's D=96 rows */
    matvec_case(&c, 9, 66, 128, 0x2345678u, 0);    /* F=66: padded block */
    matvec_case(&c, 12, 256, 128, 0x3456789u, 0);  /* two groups per row */
    matvec_case(&c, 16, 256, 32, 0x456789Au, 0);   /* eight groups per row */
    matvec_case(&c, 16, 256, 128, 0x56789ABu, 1);  /* codes 0/15, +-127 */
    q8_case(&c, 16, 64, 32, 0x9ABCDEFu, 0);      /* stories260K's dim: groups of 32 */
    q8_case(&c, 9, 172, 32, 0xABCDEF1u, 0);      /* its hidden: five 32s and a 12 */
    q8_case(&c, 9, 172, 172, 0xDEF1234u, 0);     /* one whole-row group */
    q8_case(&c, 16, 256, 32, 0xBCDEF12u, 1);     /* +-127 codes and inputs */
    f32_case(&c, 13, 172, 0xCDEF123u);           /* a 4-column tail */
    dot_case(&c, 256, 0x6789ABCu, 0);
    dot_case(&c, 16, 0x789ABCDu, 0);
    dot_case(&c, 256, 0x89ABCDEu, 1);
    silicon_probes(&c);
    float_probe_all(&c);
    char line[80];
    snprintf(line, sizeof line, "selftest failures=%d probe_differences=%d", c.failures,
             c.differences);
    say(&c, line);
    return c.failures;
}
