/* The cost model's PIE instruction counter: mpllm.costmodel.pie_counter.measure_pie_counts
 * builds it against native/engine's kernels_pie.c and pie_model.c (with -DCOUNT_S8 when
 * kernels.h declares llm_matvec_s8_pie, -DCOUNT_Q8 when it declares llm_matvec_q8_pie)
 * and parses what it prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "pie_model.h"
/* argv: q rows cols group ... | s rows n | e rows cols group (int8 groups); prints the PIE
 * instructions of one call */
int main(int argc, char **argv) {
    int a = 1;
    while (a < argc) {
        if (argv[a][0] == 'q' && a + 3 < argc) {
            uint32_t rows = (uint32_t)atol(argv[a + 1]), cols = (uint32_t)atol(argv[a + 2]);
            uint32_t group = (uint32_t)atol(argv[a + 3]);
            uint32_t nb = (cols + 31u) / 32u, ng = (cols + group - 1u) / group;
            uint8_t *codes = aligned_alloc(16, (size_t)rows * nb * 16u + 16u);
            float *scales = aligned_alloc(16, ((size_t)rows * ng * 4u + 15u) / 16u * 16u + 16u);
            int8_t *xq = aligned_alloc(16, nb * 32u);
            float *y = aligned_alloc(16, ((size_t)rows * 4u + 15u) / 16u * 16u + 16u);
            if (!codes || !scales || !xq || !y) { fprintf(stderr, "out of memory\n"); return 2; }
            memset(codes, 0x88, (size_t)rows * nb * 16u);
            for (size_t i = 0; i < (size_t)rows * ng; i++) scales[i] = 1.0f;
            for (uint32_t i = 0; i < nb * 32u; i++) xq[i] = (int8_t)(i < cols ? (i % 7) - 3 : 0);
            llm_q4 w;
            memset(&w, 0, sizeof w);
            w.codes = codes; w.scales = scales; w.rows = rows; w.cols = cols;
            w.group = group; w.n_groups = ng; w.row_bytes = nb * 16u;
            llm_pie_counts_reset();
            llm_matvec_q4_pie(&w, xq, 1.0f, y, 0, rows);
            printf("q %u %u %u %llu\n", rows, cols, group,
                   (unsigned long long)llm_pie_counts_total());
            free(codes); free(scales); free(xq); free(y);
            a += 4;
#ifdef COUNT_S8
        } else if (argv[a][0] == 's' && a + 2 < argc) {
            uint32_t rows = (uint32_t)atol(argv[a + 1]), n = (uint32_t)atol(argv[a + 2]);
            int8_t *m = aligned_alloc(16, (size_t)rows * n + 16u);
            int8_t *x = aligned_alloc(16, n + 16u);
            int32_t *out = aligned_alloc(16, (size_t)rows * 4u + 16u);
            if (!m || !x || !out) { fprintf(stderr, "out of memory\n"); return 2; }
            for (size_t i = 0; i < (size_t)rows * n; i++) m[i] = (int8_t)((i % 5) - 2);
            for (uint32_t i = 0; i < n; i++) x[i] = (int8_t)((i % 7) - 3);
            llm_pie_counts_reset();
            llm_matvec_s8_pie(m, rows, n, x, out);
            printf("s %u %u %llu\n", rows, n, (unsigned long long)llm_pie_counts_total());
            free(m); free(x); free(out);
            a += 3;
#endif
#ifdef COUNT_Q8
        } else if (argv[a][0] == 'e' && a + 3 < argc) {
            /* int8 weights in groups (kernels.h llm_q8): rows of cols rounded up to 32 */
            uint32_t rows = (uint32_t)atol(argv[a + 1]), cols = (uint32_t)atol(argv[a + 2]);
            uint32_t group = (uint32_t)atol(argv[a + 3]);
            uint32_t width = (cols + 31u) / 32u * 32u;
            uint32_t ng = group >= cols ? 1u : (cols + group - 1u) / group;
            int8_t *codes = aligned_alloc(16, (size_t)rows * width + 16u);
            float *scales = aligned_alloc(16, ((size_t)rows * ng * 4u + 15u) / 16u * 16u + 16u);
            int8_t *xq = aligned_alloc(16, width + 16u);
            float *xs = aligned_alloc(16, ((size_t)ng * 4u + 15u) / 16u * 16u + 16u);
            float *y = aligned_alloc(16, ((size_t)rows * 4u + 15u) / 16u * 16u + 16u);
            if (!codes || !scales || !xq || !xs || !y) { fprintf(stderr, "out of memory\n"); return 2; }
            for (size_t i = 0; i < (size_t)rows * width; i++) codes[i] = (int8_t)((i % 5) - 2);
            for (size_t i = 0; i < (size_t)rows * ng; i++) scales[i] = 1.0f;
            for (uint32_t i = 0; i < ng; i++) xs[i] = 1.0f;
            for (uint32_t i = 0; i < width; i++) xq[i] = (int8_t)(i < cols ? (i % 7) - 3 : 0);
            llm_q8 w;
            memset(&w, 0, sizeof w);
            w.codes = codes; w.scales = scales; w.rows = rows; w.cols = cols;
            w.group = group; w.n_groups = ng; w.row_bytes = width;
            llm_pie_counts_reset();
            llm_matvec_q8_pie(&w, xq, xs, y, 0, rows);
            printf("e %u %u %u %llu\n", rows, cols, group,
                   (unsigned long long)llm_pie_counts_total());
            free(codes); free(scales); free(xq); free(xs); free(y);
            a += 4;
#endif
        } else {
            fprintf(stderr, "bad arguments at %d\n", a);
            return 2;
        }
    }
    return 0;
}
