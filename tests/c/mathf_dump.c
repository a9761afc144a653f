/*
 * Test driver for native/engine/mathf.c (driven by tests/test_numerics.py).
 *
 *   mathf_dump eval IN OUT   IN: raw f32 inputs; OUT: for each input the raw
 *                            f32 results of llm_expf, llm_logf, llm_erff
 *                            (three floats per input, in that order)
 *   mathf_dump ulp STRIDE    sweep every STRIDE-th float32 bit pattern (and
 *                            its neighbours) against float64 libm; print the
 *                            max ulp error per function and any result that
 *                            breaks the documented special-value rules
 *
 * A freestanding build (tests/c/freestanding, for qemu-xtensa) has eval
 * only: the ulp sweep needs float64 libm, which it does not have.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f32_bits.h"
#include "mathf.h"

static int do_eval(const char *in_path, const char *out_path) {
    FILE *fi = fopen(in_path, "rb");
    if (!fi) {
        perror(in_path);
        return 2;
    }
    FILE *fo = fopen(out_path, "wb");
    if (!fo) {
        perror(out_path);
        fclose(fi);
        return 2;
    }
    float x;
    while (fread(&x, sizeof x, 1, fi) == 1) {
        float y[3] = {llm_expf(x), llm_logf(x), llm_erff(x)};
        if (fwrite(y, sizeof y[0], 3, fo) != 3) {
            perror(out_path);
            fclose(fi);
            fclose(fo);
            return 2;
        }
    }
    fclose(fi);
    return fclose(fo) == 0 ? 0 : 2;
}

#if __STDC_HOSTED__
/* error of y against the exact value ref, in units of the float32 ulp at ref */
static double ulp_err(float y, double ref) {
    if (isinf(ref) || fabs(ref) > 3.4028235677973366e38) {
        return isinf(y) && (y > 0) == (ref > 0) ? 0.0 : 1e9;
    }
    double a = fabs(ref);
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int ue = e - 24;
    if (ue < -149) {
        ue = -149;
    }
    return fabs((double)y - ref) / ldexp(1.0, ue);
}

static int do_ulp(uint32_t stride) {
    double worst[3] = {0, 0, 0};
    float at[3] = {0, 0, 0};
    long bad = 0;
    for (uint64_t base = 0; base <= 0xffffffffu; base += stride) {
        for (uint32_t d = 0; d < 2; d++) {
            uint64_t b = base + d;
            if (b > 0xffffffffu) {
                break;
            }
            float x = llm_f32_from_bits((uint32_t)b);
            if (isnan(x)) {
                if (!isnan(llm_expf(x)) || !isnan(llm_logf(x)) || !isnan(llm_erff(x))) {
                    bad++;
                }
                continue;
            }
            double xd = x;
            float ys[3] = {llm_expf(x), llm_logf(x), llm_erff(x)};
            double refs[3] = {exp(xd), xd < 0 ? NAN : log(xd), erf(xd)};
            for (int f = 0; f < 3; f++) {
                if (isnan(refs[f])) {
                    if (!isnan(ys[f])) {
                        bad++;
                    }
                    continue;
                }
                double u = ulp_err(ys[f], refs[f]);
                if (u > worst[f]) {
                    worst[f] = u;
                    at[f] = x;
                }
            }
        }
    }
    printf("expf %.4f %a\nlogf %.4f %a\nerff %.4f %a\nbad %ld\n", worst[0], at[0],
           worst[1], at[1], worst[2], at[2], bad);
    return 0;
}
#endif

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "eval") == 0) {
        return do_eval(argv[2], argv[3]);
    }
#if __STDC_HOSTED__
    if (argc == 3 && strcmp(argv[1], "ulp") == 0) {
        long s = strtol(argv[2], NULL, 10);
        if (s < 1) {
            fprintf(stderr, "stride must be >= 1\n");
            return 2;
        }
        return do_ulp((uint32_t)s);
    }
#endif
    fprintf(stderr, "usage: mathf_dump eval IN OUT | mathf_dump ulp STRIDE\n");
    return 2;
}
