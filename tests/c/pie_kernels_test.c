/*
 * PIE kernels (kernels_pie.c, through the host model) against their scalar
 * references (kernels_ref.c), compared bit for bit (memcmp of the outputs).
 *
 *   pie_kernels_test random SEED N   N random shapes: rows 1..300, cols
 *                                    16..768 (padding included), groups of
 *                                    32..256 or whole rows, random row range;
 *                                    plus N random dot products
 *   pie_kernels_test extreme         +-127 activations, codes 0 and 15,
 *                                    multi-group rows (group 128, 768 cols)
 *   pie_kernels_test splits          every row split [0,k)+[k,rows) of a few
 *                                    shapes, and every [a,b) of a small one
 *   pie_kernels_test misaligned-x    activations 1 byte off (must abort)
 *   pie_kernels_test misaligned-w    weight rows 8 bytes off (must abort)
 *   pie_kernels_test misaligned-dot  llm_matvec_s8 operand 4 bytes off (must abort)
 *   pie_kernels_test cols SEED N      N random llm_matvec_q4_cols calls, every
 *                                    column against the single-vector ref
 *   pie_kernels_test wide SEED N      N random int8 (Q8_0) and N random fp32
 *                                    matrices: rows 1..200, cols 1..400,
 *                                    groups of 32..256 or whole rows, random
 *                                    row range, 1..8 columns (the _cols
 *                                    kernels, each column against the
 *                                    single-vector ref), fp32 inputs at any
 *                                    float offset
 *   pie_kernels_test counts          PIE instructions per 32 weights and per
 *                                    token for the release model's shapes
 * Every mode prints "compared=<n> mismatches=<m> digest=<hex>" (counts
 * prints a table) and exits 1 on any mismatch; the digest folds the
 * reference outputs, so two builds can show they ran the same cases.
 *
 * Built with LLM_PIE_NATIVE for the real ESP32-S3 instructions (the
 * freestanding build in tests/c/freestanding, run under qemu-xtensa:
 * tests/test_pie_xtensa_qemu.py), nothing counts instructions, so `counts`
 * and the instruction table of `cols` are left out, and the misaligned
 * modes do not abort (the native kernels read whatever the address gives).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "align_up.h"
#include "kernels.h"
#if !defined(LLM_PIE_NATIVE)
#include "pie_model.h"
#endif

static uint64_t rng_state;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rnd_below(uint32_t n) { return (uint32_t)(rnd() % n); }

static float rnd_float(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rnd() >> 11) / 9007199254740992.0);
}

static void *xalloc(size_t n) {
    void *p = aligned_alloc(16, (n + 15) / 16 * 16);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

typedef struct matrix {
    llm_q4 w;
    uint8_t *codes;
    float *scales;
    int8_t *xq;
    float xscale;
    uint32_t cols_padded;
} matrix;

enum { CODES_RANDOM, CODES_ZERO, CODES_FIFTEEN, CODES_ALTERNATE };
enum { ACT_RANDOM, ACT_QUANTIZED, ACT_PLUS127, ACT_MINUS127, ACT_ALTERNATE, ACT_ZERO };

static uint8_t pick_code(int kind, uint32_t r, uint32_t c) {
    switch (kind) {
    case CODES_ZERO: return 0;
    case CODES_FIFTEEN: return 15;
    case CODES_ALTERNATE: return ((r + c) & 1) ? 15 : 0;
    default: return (uint8_t)rnd_below(16);
    }
}

/* Pack to the image's KIND_Q4 layout: 32-column blocks, byte 16b+k holds
 * column 32b+k in the low nibble and 32b+k+16 in the high one; padding
 * columns get code 8. */
static void make_matrix(matrix *m, uint32_t rows, uint32_t cols, uint32_t group, int codes_kind,
                        int act_kind) {
    m->cols_padded = (uint32_t)llm_align_up(cols, 32u);
    uint32_t row_bytes = m->cols_padded / 2u;
    uint32_t n_groups = (cols + group - 1u) / group;
    m->codes = xalloc((size_t)rows * row_bytes);
    m->scales = xalloc((size_t)rows * n_groups * sizeof(float));
    m->xq = xalloc(m->cols_padded);
    memset(m->codes, 0, (size_t)rows * row_bytes);
    for (uint32_t r = 0; r < rows; r++) {
        uint8_t *row = m->codes + (size_t)r * row_bytes;
        for (uint32_t c = 0; c < m->cols_padded; c++) {
            uint8_t code = c < cols ? pick_code(codes_kind, r, c) : 8;
            uint32_t b = c / 32u, k = c % 32u;
            uint8_t *byte = row + 16u * b + (k % 16u);
            if (k < 16u)
                *byte = (uint8_t)((*byte & 0xF0u) | code);
            else
                *byte = (uint8_t)((*byte & 0x0Fu) | (uint32_t)code << 4);
        }
        for (uint32_t g = 0; g < n_groups; g++) {
            /* fp16-like magnitudes with both signs, occasionally zero */
            float s = rnd_below(17) == 0 ? 0.f : rnd_float(-0.05f, 0.05f);
            m->scales[(size_t)r * n_groups + g] = s;
        }
    }
    if (act_kind == ACT_QUANTIZED) {
        float *x = xalloc(cols * sizeof(float));
        float amp = rnd_float(0.001f, 40.f);
        for (uint32_t c = 0; c < cols; c++) x[c] = rnd_float(-amp, amp);
        llm_quantize_act(x, cols, m->cols_padded, m->xq, &m->xscale);
        free(x);
    } else {
        for (uint32_t c = 0; c < m->cols_padded; c++) {
            int v = 0;
            if (c < cols) {
                switch (act_kind) {
                case ACT_PLUS127: v = 127; break;
                case ACT_MINUS127: v = -127; break;
                case ACT_ALTERNATE: v = (c & 1) ? -127 : 127; break;
                case ACT_ZERO: v = 0; break;
                default: v = (int)rnd_below(255) - 127;
                }
            }
            m->xq[c] = (int8_t)v;
        }
        m->xscale = rnd_float(1e-4f, 0.5f);
    }
    m->w = (llm_q4){.codes = m->codes, .scales = m->scales, .rows = rows, .cols = cols,
                    .group = group, .n_groups = n_groups, .row_bytes = row_bytes};
}

static void free_matrix(matrix *m) {
    free(m->codes);
    free(m->scales);
    free(m->xq);
}

static uint64_t compared, mismatches;
/* FNV-1a over every reference output compared, in order: equal digests on
 * two builds mean they drew the same cases and their references (scalar
 * float code) gave the same bits, so the S3 build checks the host's cases. */
static uint64_t digest = 0xcbf29ce484222325ull;

static void fold(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) digest = (digest ^ b[i]) * 0x100000001b3ull;
}

/* any NaN folds as one: which NaN an operation gives is not part of the
 * contract (and differs between the host's FPU and the S3's) */
static void fold_floats(const float *p, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t quiet_nan = 0x7fc00000u;
        if (p[i] != p[i])
            fold(&quiet_nan, 4);
        else
            fold(&p[i], 4);
    }
}

/* Run ref over all rows and PIE over [a,b) (sentinel elsewhere); compare the
 * PIE rows to the reference rows byte for byte, and the other rows to the
 * sentinel (they must be untouched). */
static void compare_range(const matrix *m, uint32_t a, uint32_t b, const char *label) {
    uint32_t rows = m->w.rows;
    float *yr = xalloc(rows * sizeof(float));
    float *yp = xalloc(rows * sizeof(float));
    llm_matvec_q4_ref(&m->w, m->xq, m->xscale, yr, 0, rows);
    memset(yp, 0xA5, rows * sizeof(float));
    llm_matvec_q4_pie(&m->w, m->xq, m->xscale, yp, a, b);
    compared++;
    fold_floats(yr, rows);
    int bad = memcmp(yp + a, yr + a, (size_t)(b - a) * sizeof(float)) != 0;
    for (uint32_t r = 0; r < rows && !bad; r++) {
        if (r >= a && r < b) continue;
        uint32_t bits;
        memcpy(&bits, yp + r, 4);
        if (bits != 0xA5A5A5A5u) bad = 2;
    }
    if (bad) {
        if (mismatches++ < 5) {
            fprintf(stderr, "MISMATCH %s rows=%u cols=%u group=%u range=[%u,%u) %s\n", label, rows,
                    m->w.cols, m->w.group, a, b, bad == 2 ? "(row outside range written)" : "");
            for (uint32_t r = a; r < b; r++)
                if (memcmp(yp + r, yr + r, 4)) {
                    fprintf(stderr, "  row %u: pie %a ref %a\n", r, (double)yp[r], (double)yr[r]);
                    break;
                }
        }
    }
    free(yr);
    free(yp);
}

static uint32_t random_group(uint32_t cols) {
    static const uint32_t options[] = {32, 64, 96, 128, 256};
    if (rnd_below(3) == 0) return cols + rnd_below(100); /* one group per row */
    return options[rnd_below(5)];
}

/* llm_matvec_s8 (the head's tile bounds): rows x n int8 against n int8. */
static void compare_dot(uint32_t rows, uint32_t n, int kind) {
    size_t na = (size_t)rows * n;
    int8_t *a = xalloc(na ? na : 16), *b = xalloc(n ? n : 16);
    int32_t *yr = xalloc(4u * (rows ? rows : 1u)), *yp = xalloc(4u * (rows ? rows : 1u));
    for (size_t i = 0; i < na; i++) {
        switch (kind) {
        case 1: a[i] = -128; break;
        case 2: a[i] = 127; break;
        default: a[i] = (int8_t)(int)(rnd_below(256) - 128);
        }
    }
    for (uint32_t i = 0; i < n; i++)
        b[i] = kind == 0 ? (int8_t)(int)(rnd_below(256) - 128) : (int8_t)-128;
    llm_matvec_s8_ref(a, rows, n, b, yr);
    memset(yp, 0xA5, 4u * (rows ? rows : 1u));
    llm_matvec_s8_pie(a, rows, n, b, yp);
    compared++;
    fold(yr, 4u * rows);
    if (memcmp(yr, yp, 4u * rows) != 0 && mismatches++ < 5)
        fprintf(stderr, "MISMATCH matvec_s8 %ux%u kind=%d: pie %" PRId32 " ref %" PRId32 "\n",
                rows, n, kind, yp[0], yr[0]);
    free(a);
    free(b);
    free(yr);
    free(yp);
}

static int report(void) {
    printf("compared=%" PRIu64 " mismatches=%" PRIu64 " digest=%016" PRIx64 "\n", compared,
           mismatches, digest);
    return mismatches ? 1 : 0;
}

/* Every draw of the generator is its own statement (or initializer): the
 * order in which a call's arguments are evaluated is unspecified, and GCC
 * picks a different one for Xtensa than for x86-64, so draws inside one
 * argument list gave the S3 build other cases than the host's. */
static int mode_random(uint64_t seed, uint32_t n) {
    rng_state = seed;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t rows = 1 + rnd_below(300), cols = 16 + rnd_below(753);
        matrix m;
        const uint32_t group = random_group(cols);
        const int act = rnd_below(2) ? ACT_QUANTIZED : ACT_RANDOM;
        make_matrix(&m, rows, cols, group, CODES_RANDOM, act);
        uint32_t a = rnd_below(rows), b = a + 1 + rnd_below(rows - a);
        if (rnd_below(4) == 0) a = 0, b = rows;
        compare_range(&m, a, b, "random");
        free_matrix(&m);
        const uint32_t dot_rows = 1u + rnd_below(8), dot_n = 16u * rnd_below(257);
        compare_dot(dot_rows, dot_n, 0);
    }
    compare_dot(2, 65536, 1); /* the contract's largest n, largest products */
    compare_dot(2, 65536, 2);
    compare_dot(199, 192, 0); /* the release head's tile bounds */
    return report();
}

static int mode_extreme(void) {
    rng_state = 7;
    static const int acts[] = {ACT_PLUS127, ACT_MINUS127, ACT_ALTERNATE, ACT_ZERO, ACT_RANDOM};
    static const int codes[] = {CODES_ZERO, CODES_FIFTEEN, CODES_ALTERNATE, CODES_RANDOM};
    static const uint32_t shapes[][3] = {{300, 768, 128}, {64, 768, 32}, {17, 768, 768},
                                         {33, 96, 128}, {9, 66, 128}, {5, 16, 32},
                                         {40, 1536, 32}, {3, 1100, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++)
            for (size_t ci = 0; ci < sizeof codes / sizeof codes[0]; ci++) {
                matrix m;
                make_matrix(&m, shapes[s][0], shapes[s][1], shapes[s][2], codes[ci], acts[ai]);
                compare_range(&m, 0, shapes[s][0], "extreme");
                free_matrix(&m);
            }
    return report();
}

static int mode_splits(void) {
    rng_state = 11;
    static const uint32_t shapes[][3] = {{300, 768, 128}, {37, 96, 96}, {66, 66, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        matrix m;
        make_matrix(&m, shapes[s][0], shapes[s][1], shapes[s][2], CODES_RANDOM, ACT_QUANTIZED);
        uint32_t rows = shapes[s][0];
        for (uint32_t k = 0; k <= rows; k++) {
            /* the two halves written into one output must equal one full call */
            float *yr = xalloc(rows * sizeof(float)), *yp = xalloc(rows * sizeof(float));
            llm_matvec_q4_ref(&m.w, m.xq, m.xscale, yr, 0, rows);
            memset(yp, 0xA5, rows * sizeof(float));
            llm_matvec_q4_pie(&m.w, m.xq, m.xscale, yp, 0, k);
            llm_matvec_q4_pie(&m.w, m.xq, m.xscale, yp, k, rows);
            compared++;
            fold_floats(yr, rows);
            if (memcmp(yp, yr, rows * sizeof(float)) && mismatches++ < 5)
                fprintf(stderr, "MISMATCH split rows=%u k=%u\n", rows, k);
            free(yr);
            free(yp);
        }
        free_matrix(&m);
    }
    matrix m;
    make_matrix(&m, 24, 160, 64, CODES_RANDOM, ACT_QUANTIZED);
    for (uint32_t a = 0; a <= 24; a++)
        for (uint32_t b = a; b <= 24; b++) compare_range(&m, a, b, "range");
    free_matrix(&m);
    return report();
}

static int mode_misaligned(const char *which) {
    rng_state = 3;
    matrix m;
    make_matrix(&m, 4, 96, 128, CODES_RANDOM, ACT_RANDOM);
    float y[4];
    if (strcmp(which, "misaligned-x") == 0) {
        int8_t *buf = xalloc(m.cols_padded + 16);
        memcpy(buf + 1, m.xq, m.cols_padded);
        llm_matvec_q4_pie(&m.w, buf + 1, m.xscale, y, 0, 4);
    } else if (strcmp(which, "misaligned-w") == 0) {
        uint8_t *buf = xalloc((size_t)4 * m.w.row_bytes + 16);
        memcpy(buf + 8, m.codes, (size_t)4 * m.w.row_bytes);
        m.w.codes = buf + 8;
        llm_matvec_q4_pie(&m.w, m.xq, m.xscale, y, 0, 4);
    } else {
        int8_t *a = xalloc(64 + 16), *b = xalloc(64);
        memset(a, 1, 80);
        memset(b, 1, 64);
        int32_t out;
        llm_matvec_s8_pie(a + 4, 1, 64, b, &out);
    }
    printf("no abort\n");
    return 0;
}

#if !defined(LLM_PIE_NATIVE)
/* PIE instruction counts of one full call per release shape. */
static int mode_counts(void) {
    rng_state = 5;
    /* D 96, L 6, F 66, P 128, Vout 25353 (the release model) */
    static const struct { const char *name; uint32_t rows, cols, per_token; } shapes[] = {
        {"ple_model_proj", 768, 96, 1}, {"qkv", 288, 96, 6},      {"attn_proj", 96, 96, 6},
        {"gate", 66, 96, 6},            {"up", 66, 96, 6},         {"down", 96, 66, 6},
        {"ple_gate", 128, 96, 6},       {"ple_proj", 96, 128, 6},  {"head", 25353, 96, 1},
    };
    uint64_t tok_total = 0, tok_mac = 0, tok_weights = 0;
    printf("%-15s %6s %5s %5s %12s %10s %10s %10s\n", "matrix", "rows", "cols", "x/tok",
           "instr/call", "per32w", "per32w_pad", "instr/tok");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        matrix m;
        make_matrix(&m, shapes[s].rows, shapes[s].cols, 128, CODES_RANDOM, ACT_QUANTIZED);
        float *y = xalloc(shapes[s].rows * sizeof(float)), *yr = xalloc(shapes[s].rows * sizeof(float));
        llm_pie_counts_reset();
        llm_matvec_q4_pie(&m.w, m.xq, m.xscale, y, 0, shapes[s].rows);
        uint64_t c[LLM_PIE_OP_COUNT];
        llm_pie_counts_get(c);
        uint64_t total = llm_pie_counts_total();
        uint64_t macs = c[LLM_PIE_OP_EE_VMULAS_S8_ACCX] + c[LLM_PIE_OP_EE_VMULAS_S8_ACCX_LD_IP] +
                        c[LLM_PIE_OP_EE_VMULAS_S8_ACCX_LD_XP];
        llm_matvec_q4_ref(&m.w, m.xq, m.xscale, yr, 0, shapes[s].rows);
        compared++;
        if (memcmp(y, yr, shapes[s].rows * sizeof(float))) mismatches++;
        double w = (double)shapes[s].rows * shapes[s].cols;
        double wp = (double)shapes[s].rows * m.cols_padded;
        printf("%-15s %6u %5u %5u %12" PRIu64 " %10.3f %10.3f %10" PRIu64 "\n", shapes[s].name,
               shapes[s].rows, shapes[s].cols, shapes[s].per_token, total, total / (w / 32.0),
               total / (wp / 32.0), total * shapes[s].per_token);
        for (int op = 0; op < LLM_PIE_OP_COUNT; op++)
            if (c[op]) printf("    %-26s %10" PRIu64 "\n", llm_pie_op_name((llm_pie_op)op), c[op]);
        tok_total += total * shapes[s].per_token;
        tok_mac += macs * shapes[s].per_token;
        tok_weights += (uint64_t)w * shapes[s].per_token;
        free(y);
        free(yr);
        free_matrix(&m);
    }
    printf("per token: matvec PIE instructions %" PRIu64 " (MACs %" PRIu64 ") over %" PRIu64
           " weights = %.3f per 32 weights\n",
           tok_total, tok_mac, tok_weights, tok_total / (tok_weights / 32.0));
    /* tile bounds: per 32 products, at the release head's 199 tiles x 192 */
    int8_t *a = xalloc(199 * 192), *b = xalloc(192);
    int32_t *out = xalloc(4 * 199), *ref = xalloc(4 * 199);
    memset(a, 3, 199 * 192);
    memset(b, -5, 192);
    llm_pie_counts_reset();
    llm_matvec_s8_pie(a, 199, 192, b, out);
    printf("matvec_s8 199x192: %" PRIu64 " instructions = %.3f per 32 products (value %" PRId32 ")\n",
           llm_pie_counts_total(), llm_pie_counts_total() / (199 * 192 / 32.0), out[0]);
    llm_matvec_s8_ref(a, 199, 192, b, ref);
    compared++;
    if (memcmp(out, ref, 4 * 199) != 0) mismatches++;
    free(a);
    free(b);
    free(out);
    free(ref);
    return report();
}
#endif

/* llm_matvec_q4_cols: m columns against the single-vector reference, column
 * by column (random shapes: resident rows of 1..3 blocks, and wider or
 * multi-group ones that take the per-column path), plus the PIE counts of
 * the release head's 96 columns for m = 1..8. */
static int mode_cols(uint64_t seed, uint32_t n) {
    rng_state = seed;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t rows = 1 + rnd_below(200);
        uint32_t cols = rnd_below(4) ? 16 + rnd_below(81) : 97 + rnd_below(200);
        uint32_t group = rnd_below(5) ? cols + rnd_below(50) : 32;
        uint32_t m = 1 + rnd_below(LLM_MATVEC_MAX_COLS);
        matrix mat;
        make_matrix(&mat, rows, cols, group, rnd_below(6) ? CODES_RANDOM : CODES_FIFTEEN,
                    ACT_QUANTIZED);
        uint32_t stride = mat.cols_padded + 16u * rnd_below(3);
        int8_t *xs = xalloc((size_t)m * stride);
        float scale[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) {
            float *x = xalloc(cols * sizeof(float));
            float amp = rnd_float(0.001f, 40.f);
            for (uint32_t k = 0; k < cols; k++)
                x[k] = rnd_below(8) ? rnd_float(-amp, amp) : (k & 1 ? amp : -amp);
            llm_quantize_act(x, cols, mat.cols_padded, xs + (size_t)c * stride, &scale[c]);
            free(x);
        }
        uint32_t a = rnd_below(rows), b = a + 1 + rnd_below(rows - a);
        size_t ys = rows + rnd_below(5);
        float *yp = xalloc(m * ys * sizeof(float)), *yr = xalloc(rows * sizeof(float));
        memset(yp, 0xA5, m * ys * sizeof(float));
        const int8_t *xp[LLM_MATVEC_MAX_COLS];
        float *yv[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) {
            xp[c] = xs + (size_t)c * stride;
            yv[c] = yp + c * ys;
        }
        llm_matvec_q4_cols_pie(&mat.w, xp, scale, m, yv, a, b);
        for (uint32_t c = 0; c < m; c++) {
            llm_matvec_q4_ref(&mat.w, xs + (size_t)c * stride, scale[c], yr, a, b);
            compared++;
            fold_floats(yr + a, b - a);
            if (memcmp(yr + a, yp + c * ys + a, (b - a) * sizeof(float)) != 0 && mismatches++ < 5)
                fprintf(stderr, "MISMATCH cols %ux%u group %u m=%u column %u rows [%u,%u)\n",
                        rows, cols, group, m, c, a, b);
        }
        free(xs);
        free(yp);
        free(yr);
        free_matrix(&mat);
    }
#if !defined(LLM_PIE_NATIVE)
    for (uint32_t m = 1; m <= LLM_MATVEC_MAX_COLS; m++) {
        matrix mat;
        make_matrix(&mat, 128, 96, 128, CODES_RANDOM, ACT_QUANTIZED);
        int8_t *xs = xalloc((size_t)m * mat.cols_padded);
        float scale[LLM_MATVEC_MAX_COLS], *y = xalloc(128 * m * sizeof(float));
        for (uint32_t c = 0; c < m; c++) {
            memcpy(xs + (size_t)c * mat.cols_padded, mat.xq, mat.cols_padded);
            scale[c] = mat.xscale;
        }
        const int8_t *xp[LLM_MATVEC_MAX_COLS];
        float *yv[LLM_MATVEC_MAX_COLS];
        for (uint32_t c = 0; c < m; c++) {
            xp[c] = xs + (size_t)c * mat.cols_padded;
            yv[c] = y + 128u * c;
        }
        llm_pie_counts_reset();
        llm_matvec_q4_cols_pie(&mat.w, xp, scale, m, yv, 0, 128);
        printf("cols m=%u 128x96: %.2f PIE instructions per row per column\n", m,
               llm_pie_counts_total() / 128.0 / m);
        free(xs);
        free(y);
        free_matrix(&mat);
    }
#endif
    return report();
}

/* Extreme values mixed into the fp32 weights and inputs and the int8 scales
 * (mode_wide's second half): zeros of both signs, subnormals, the largest
 * floats, infinities and a NaN, so the sums overflow, cancel to zero and turn
 * NaN, and each kernel must round (and propagate) exactly as the other. */
static int extreme;
static const float EXTREMES[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, -0x1.8p-127f,
                                 3.4028235e38f, -3.4028235e38f, 1e20f, -1e20f,
                                 (float)INFINITY, -(float)INFINITY, (float)NAN};

/* The same bits, except that any NaN equals any NaN: which NaN a sum of
 * NaNs (or inf - inf) gives depends on the operand order the compiler picks
 * for a commutative add, so only "NaN" is part of the contract. */
static int same_floats(const float *p, const float *q, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(&p[i], &q[i], sizeof(float)) != 0 && !(p[i] != p[i] && q[i] != q[i])) return 0;
    return 1;
}

static float maybe_extreme(float v) {
    return extreme && rnd_below(5) == 0 ? EXTREMES[rnd_below(sizeof EXTREMES / sizeof EXTREMES[0])]
                                        : v;
}

/* One int8 matrix of random codes (padding 0) and scales, m activation
 * vectors quantized in its groups: the PIE kernels (single and _cols) against
 * the reference, bit for bit. */
static void compare_q8(uint32_t rows, uint32_t cols, uint32_t group, uint32_t m) {
    const uint32_t padded = (uint32_t)llm_align_up(cols, 32u);
    const uint32_t ng = (cols + group - 1u) / group;
    int8_t *codes = xalloc((size_t)rows * padded);
    float *scales = xalloc((size_t)rows * ng * sizeof(float));
    memset(codes, 0, (size_t)rows * padded);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t j = 0; j < cols; j++)
            codes[(size_t)r * padded + j] = (int8_t)(rnd_below(6) ? (int)rnd_below(255) - 127
                                                                   : (rnd_below(2) ? 127 : -127));
        if (extreme) /* the whole int8 range, -128 too: the widest products */
            for (uint32_t j = 0; j < cols; j++)
                if (rnd_below(4) == 0) codes[(size_t)r * padded + j] = rnd_below(2) ? 127 : -128;
        for (uint32_t g = 0; g < ng; g++)
            scales[(size_t)r * ng + g] = maybe_extreme(rnd_float(1e-4f, 0.3f));
    }
    llm_q8 w = {codes, scales, rows, cols, group, ng, padded};
    int8_t *xq = xalloc((size_t)m * padded);
    float *xs = xalloc((size_t)m * ng * sizeof(float));
    float *x = xalloc(cols * sizeof(float));
    for (uint32_t c = 0; c < m; c++) {
        float amp = rnd_float(0.001f, 40.f);
        for (uint32_t k = 0; k < cols; k++)
            x[k] = rnd_below(8) ? rnd_float(-amp, amp) : (k & 1 ? amp : -amp);
        llm_quantize_act_groups(x, cols, group, padded, xq + (size_t)c * padded, xs + (size_t)c * ng);
    }
    uint32_t a = rnd_below(rows), b = a + 1 + rnd_below(rows - a);
    float *yp = xalloc((size_t)m * rows * sizeof(float)), *yr = xalloc(rows * sizeof(float));
    memset(yp, 0xA5, (size_t)m * rows * sizeof(float));
    const int8_t *xp[LLM_MATVEC_MAX_COLS];
    const float *sp[LLM_MATVEC_MAX_COLS];
    float *yv[LLM_MATVEC_MAX_COLS];
    for (uint32_t c = 0; c < m; c++) {
        xp[c] = xq + (size_t)c * padded;
        sp[c] = xs + (size_t)c * ng;
        yv[c] = yp + (size_t)c * rows;
    }
    if (m == 1u)
        llm_matvec_q8_pie(&w, xp[0], sp[0], yv[0], a, b);
    else
        llm_matvec_q8_cols_pie(&w, xp, sp, m, yv, a, b);
    for (uint32_t c = 0; c < m; c++) {
        llm_matvec_q8_ref(&w, xp[c], sp[c], yr, a, b);
        compared++;
        fold_floats(yr + a, b - a);
        if (!same_floats(yr + a, yv[c] + a, b - a) && mismatches++ < 5)
            fprintf(stderr, "MISMATCH q8 %ux%u group %u m=%u column %u rows [%u,%u)\n", rows,
                    cols, group, m, c, a, b);
    }
    free(codes);
    free(scales);
    free(xq);
    free(xs);
    free(x);
    free(yp);
    free(yr);
}

/* One fp32 matrix (rows padded to 4 floats with zeros) and m input vectors
 * at a random float offset: the scalar "PIE" flavour against the lane-array
 * reference, bit for bit. */
static void compare_f32(uint32_t rows, uint32_t cols, uint32_t m) {
    const uint32_t rf = (uint32_t)llm_align_up(cols, 4u);
    float *wv = xalloc((size_t)rows * rf * sizeof(float));
    memset(wv, 0, (size_t)rows * rf * sizeof(float));
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < cols; j++)
            wv[(size_t)r * rf + j] = maybe_extreme(rnd_below(16) ? rnd_float(-1.f, 1.f)
                                                                 : rnd_float(-1e3f, 1e3f));
    llm_f32m w = {wv, rows, cols, rf};
    const uint32_t off = rnd_below(4), stride = cols + off + rnd_below(3);
    float *xs = xalloc(((size_t)m * stride + off) * sizeof(float));
    for (size_t k = 0; k < (size_t)m * stride + off; k++) xs[k] = maybe_extreme(rnd_float(-4.f, 4.f));
    uint32_t a = rnd_below(rows), b = a + 1 + rnd_below(rows - a);
    float *yp = xalloc((size_t)m * rows * sizeof(float)), *yr = xalloc(rows * sizeof(float));
    memset(yp, 0xA5, (size_t)m * rows * sizeof(float));
    const float *xp[LLM_MATVEC_MAX_COLS];
    float *yv[LLM_MATVEC_MAX_COLS];
    for (uint32_t c = 0; c < m; c++) {
        xp[c] = xs + off + (size_t)c * stride;
        yv[c] = yp + (size_t)c * rows;
    }
    if (m == 1u)
        llm_matvec_f32_pie(&w, xp[0], yv[0], a, b);
    else
        llm_matvec_f32_cols_pie(&w, xp, m, yv, a, b);
    for (uint32_t c = 0; c < m; c++) {
        llm_matvec_f32_ref(&w, xp[c], yr, a, b);
        compared++;
        fold_floats(yr + a, b - a);
        if (!same_floats(yr + a, yv[c] + a, b - a) && mismatches++ < 5)
            fprintf(stderr, "MISMATCH f32 %ux%u m=%u column %u rows [%u,%u)\n", rows, cols, m,
                    c, a, b);
    }
    free(wv);
    free(xs);
    free(yp);
    free(yr);
}

static int mode_wide(uint64_t seed, uint32_t n) {
    rng_state = seed;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t rows = 1 + rnd_below(200);
        uint32_t cols = 1 + rnd_below(400);
        /* a multiple of 32 below cols, else the whole row */
        uint32_t group = cols > 32u && rnd_below(3) ? 32u * (1u + rnd_below((cols - 1u) / 32u))
                                                    : cols;
        if (group > 256u) group = cols;
        compare_q8(rows, cols, group, 1 + rnd_below(LLM_MATVEC_MAX_COLS));
        const uint32_t f_rows = 1 + rnd_below(200), f_cols = 1 + rnd_below(400);
        const uint32_t f_m = 1 + rnd_below(LLM_MATVEC_MAX_COLS);
        compare_f32(f_rows, f_cols, f_m);
    }
    /* the stories260K shapes: group 32 of 64 columns; its 172-column rows in
     * groups of 32 (the last holds 12), and as one whole-row group */
    compare_q8(128, 64, 32, 1);
    compare_q8(64, 172, 32, 8);
    compare_q8(64, 172, 172, 8);
    compare_f32(172, 64, 1);
    compare_f32(64, 172, 8);
    extreme = 1;
    for (uint32_t t = 0; t < n / 4u + 1u; t++) {
        uint32_t rows = 1 + rnd_below(200);
        uint32_t cols = 1 + rnd_below(400);
        const uint32_t group = cols > 32u && rnd_below(2) ? 32u : cols;
        compare_q8(rows, cols, group, 1 + rnd_below(4));
        const uint32_t f_rows = 1 + rnd_below(200), f_cols = 1 + rnd_below(400);
        compare_f32(f_rows, f_cols, 1 + rnd_below(4));
    }
    extreme = 0;
    return report();
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "wide") == 0)
        return mode_wide(strtoull(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0));
    if (argc >= 4 && strcmp(argv[1], "cols") == 0)
        return mode_cols(strtoull(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0));
    if (argc >= 4 && strcmp(argv[1], "random") == 0)
        return mode_random(strtoull(argv[2], NULL, 0), (uint32_t)strtoul(argv[3], NULL, 0));
    if (argc == 2 && strcmp(argv[1], "extreme") == 0) return mode_extreme();
    if (argc == 2 && strcmp(argv[1], "splits") == 0) return mode_splits();
    if (argc == 2 && strncmp(argv[1], "misaligned", 10) == 0) return mode_misaligned(argv[1]);
#if !defined(LLM_PIE_NATIVE)
    if (argc == 2 && strcmp(argv[1], "counts") == 0) return mode_counts();
#endif
    fprintf(stderr, "usage: pie_kernels_test random SEED N | extreme | splits | "
                    "misaligned-x | misaligned-w | misaligned-dot | counts | cols SEED N | "
                    "wide SEED N\n");
    return 2;
}
