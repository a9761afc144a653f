/*
 * Portable float32 exp / log / erf; see mathf.h for the why and the accuracy.
 * Every constant is a hex float so the Python mirror can use the same bits.
 * The order of every + and * below is part of the contract: changing it
 * changes results in the last bit and breaks host/board/reference agreement.
 */
#include "mathf.h"

#include <float.h>
#include <stdint.h>

#include "f32_bits.h"
#include "hot.h"
#include "simd.h"

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "llm mathf needs FLT_EVAL_METHOD == 0 (plain float32 arithmetic)"
#endif

/* 1.5 * 2^23: (t + S) - S rounds t to an integer, ties to even, for |t| < 2^22. */
#define LLM_ROUND_SHIFT 0x1.8p23f
#define LLM_LOG2E 0x1.715476p+0f
/* ln2 split: LN2_HI has 9 significant bits, so k * LN2_HI is exact for |k| < 2^15. */
#define LLM_LN2_HI 0x1.63p-1f
#define LLM_LN2_LO -0x1.bd0106p-13f

/* exp(x) = y * 2^n for x in [-104, 89]: the range reduction and polynomial,
 * shared by llm_expf and llm_expf4 so both run the same operations. */
static inline float expf_core(float x, int32_t *n_out) {
    /* x = k*ln2 + r with |r| <= ln2/2 (plus rounding); k in [-150, 128]. */
    float t = x * LLM_LOG2E;
    float k = (t + LLM_ROUND_SHIFT) - LLM_ROUND_SHIFT;
    *n_out = (int32_t)k;
    float r = x - k * LLM_LN2_HI; /* exact (Sterbenz) */
    r = r - k * LLM_LN2_LO;
    /* exp(r) = 1 + r + r^2 * q(r), q fitted near-minimax on |r| <= 0.3466 */
    float q = 0x1.6a243ap-10f;
    q = 0x1.1239ep-7f + r * q;
    q = 0x1.5558f2p-5f + r * q;
    q = 0x1.555492p-3f + r * q;
    q = 0x1.fffffcp-2f + r * q;
    return 1.0f + (r + (r * r) * q);
}

float LLM_HOT llm_expf(float x) {
    if (x != x) {
        return x + x;
    }
    if (x > 89.0f) {
        return llm_f32_from_bits(0x7f800000u);
    }
    if (x < -104.0f) {
        return 0.0f;
    }
    int32_t n;
    float y = expf_core(x, &n);
    /* y * 2^n; the scale is split so each product rounds at most once. */
    if (n > 127) {
        return (y * 0x1p127f) * 2.0f;
    }
    if (n < -126) {
        return (y * llm_f32_from_bits((uint32_t)(n + 100 + 127) << 23)) * 0x1p-100f;
    }
    return y * llm_f32_from_bits((uint32_t)(n + 127) << 23);
}

/* In [-87, 88], k (and n) stays in [-126, 127], where llm_expf takes its
 * plain `y * 2^n` path; every other input (NaN, infinities, the extremes)
 * goes through llm_expf itself. The four lanes are independent chains with
 * no branch between them, so an in-order core can overlap their float
 * latencies; each lane runs llm_expf's exact operations. */
void LLM_HOT llm_expf4(const float x[4], float y[4]) {
    float v[4];
    int32_t n[4];
    int normal[4];
    for (int i = 0; i < 4; i++) {
        normal[i] = x[i] >= -87.0f && x[i] <= 88.0f; /* false for NaN */
        v[i] = normal[i] ? x[i] : 0.0f;
    }
    /* unrolled, so the compiler's scheduler sees four independent chains */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) v[i] = expf_core(v[i], &n[i]);
    for (int i = 0; i < 4; i++)
        y[i] = normal[i] ? v[i] * llm_f32_from_bits((uint32_t)(n[i] + 127) << 23) : llm_expf(x[i]);
}

#if LLM_SIMD
/* expf_core on four lanes: the same operations in the same order, each lane
 * rounding as the scalar one does (simd.h), so each lane's y and n are
 * expf_core's for its x. (int32 conversion of k, an integer in [-126, 127]
 * on the lanes that use it, is exact either way.) */
static inline llm_f4 expf_core_f4(llm_f4 x, llm_i4 *n_out) {
    llm_f4 t = x * LLM_LOG2E;
    llm_f4 k = (t + LLM_ROUND_SHIFT) - LLM_ROUND_SHIFT;
    *n_out = __builtin_convertvector(k, llm_i4);
    llm_f4 r = x - k * LLM_LN2_HI;
    r = r - k * LLM_LN2_LO;
    llm_f4 q = llm_f4_splat(0x1.6a243ap-10f);
    q = 0x1.1239ep-7f + r * q;
    q = 0x1.5558f2p-5f + r * q;
    q = 0x1.555492p-3f + r * q;
    q = 0x1.fffffcp-2f + r * q;
    return 1.0f + (r + (r * r) * q);
}

/* Four lanes of llm_expf(x): the plain `y * 2^n` path where every lane is in
 * [-87, 88] (as llm_expf4), else llm_expf itself on the lanes outside. */
static inline void expf_f4(llm_f4 x, float *y) {
    const llm_i4 ok = (x >= -87.0f) & (x <= 88.0f); /* all ones, or 0 (NaN too) */
    const llm_f4 v = (llm_f4)((llm_i4)x & ok);      /* +0 on the other lanes */
    llm_i4 n;
    const llm_f4 c = expf_core_f4(v, &n);
    llm_f4_store(y, c * (llm_f4)((n + 127) << 23));
    if (!(ok[0] & ok[1] & ok[2] & ok[3]))
        for (int i = 0; i < 4; i++)
            if (!ok[i]) y[i] = llm_expf(x[i]);
}

/* y[i] = llm_expf(x[i] - sub), or llm_expf(x[i]) without `sub` (has_sub a
 * constant in the two callers: the subtraction is there or not at all). */
static inline void expf_n(const float *x, float sub, float *y, uint32_t n, const int has_sub) {
    uint32_t i = 0;
    /* two vectors a step: independent chains for the pipeline */
    for (; i + 8u <= n; i += 8u) {
        llm_f4 a = llm_f4_load(x + i), b = llm_f4_load(x + i + 4u);
        if (has_sub) {
            a -= sub;
            b -= sub;
        }
        expf_f4(a, y + i);
        expf_f4(b, y + i + 4u);
    }
    if (i + 4u <= n) {
        llm_f4 a = llm_f4_load(x + i);
        if (has_sub) a -= sub;
        expf_f4(a, y + i);
        i += 4u;
    }
    for (; i < n; i++) y[i] = llm_expf(has_sub ? x[i] - sub : x[i]);
}

void llm_expf_sub_n(const float *x, float sub, float *y, uint32_t n) { expf_n(x, sub, y, n, 1); }

void llm_expf_n(const float *x, float *y, uint32_t n) { expf_n(x, 0.0f, y, n, 0); }
#endif

float LLM_HOT llm_logf(float x) {
    uint32_t ix = llm_f32_bits(x);
    if (x != x) {
        return x + x;
    }
    if ((ix & 0x7fffffffu) == 0) {
        return llm_f32_from_bits(0xff800000u); /* -inf */
    }
    if (ix >> 31) {
        float zero = 0.0f;
        return zero / zero; /* negative: NaN */
    }
    if (ix == 0x7f800000u) {
        return x;
    }
    int32_t e = 0;
    if (ix < 0x00800000u) {
        /* subnormal: scale into the normal range (exact) */
        x = x * 0x1p25f;
        ix = llm_f32_bits(x);
        e = -25;
    }
    e += (int32_t)(ix >> 23) - 127;
    uint32_t mant = ix & 0x007fffffu;
    /* m in [sqrt(1/2), sqrt(2)): keeps log(m) small and symmetric */
    if (mant > 0x3504f3u) {
        mant |= 0x3f000000u; /* m in [0.5, 1) */
        e += 1;
    } else {
        mant |= 0x3f800000u; /* m in [1, 2) */
    }
    float m = llm_f32_from_bits(mant);
    float f = m - 1.0f; /* exact */
    /* log(1+f) = f - (hfsq - s*(hfsq + R(s^2))), s = f/(2+f) */
    float s = f / (2.0f + f);
    float z = s * s;
    float R = 0x1.31e1fcp-2f;
    R = 0x1.995ec6p-2f + z * R;
    R = 0x1.55557ap-1f + z * R;
    R = z * R;
    float hfsq = (0.5f * f) * f;
    float dk = (float)e;
    float w = s * (hfsq + R) + dk * LLM_LN2_LO;
    w = (hfsq - w) - f;
    return dk * LLM_LN2_HI - w;
}

/* erf(|x|) on [1, 4): 6 intervals of width 1/2, each a degree-7 polynomial in
 * t = |x| - midpoint (t is exact: |x| and the midpoint share the ulp grid). */
static const float llm_erf_mid[6][8] = {
    {0x1.d8865ep-1f, 0x1.e4653p-3f, -0x1.2ebf54p-2f, 0x1.571d14p-3f,
     -0x1.91ded2p-8f, -0x1.82905p-5f, 0x1.517a18p-6f, 0x1.ec8e7p-9f},
    {0x1.f92d08p-1f, 0x1.b0553p-5f, -0x1.7a4a8p-4f, 0x1.7148ecp-4f,
     -0x1.8a1486p-5f, 0x1.b1a74cp-8f, 0x1.28858ap-7f, -0x1.83f5aap-8f},
    {0x1.ff4048p-1f, 0x1.d4143cp-8f, -0x1.074b2p-6f, 0x1.63ef22p-6f,
     -0x1.38bdfp-6f, 0x1.5d542ep-7f, -0x1.6c53eap-9f, -0x1.7d36ecp-11f},
    {0x1.fff2dp-1f, 0x1.3360dp-11f, -0x1.a6a56ep-10f, 0x1.69cedep-9f,
     -0x1.aafeb6p-9f, 0x1.6949dap-9f, -0x1.b535a2p-10f, 0x1.4cc3f6p-11f},
    {0x1.ffff7p-1f, 0x1.e9b5cep-16f, -0x1.8de92ap-14f, 0x1.9aa6d6p-13f,
     -0x1.2c120ep-12f, 0x1.48d174p-12f, -0x1.1f0e16p-12f, 0x1.6ce3e2p-13f},
    {0x1.fffffcp-1f, 0x1.d9364cp-21f, -0x1.bbbbb8p-19f, 0x1.0b7378p-17f,
     -0x1.ce8feap-17f, 0x1.335912p-16f, -0x1.5b2874p-16f, 0x1.214804p-16f},
};

/* erf(x)/x - 1 = p(x^2) on |x| < 1 */
static const float llm_erf_small[8] = {
    0x1.06eba8p-3f, -0x1.812746p-2f, 0x1.ce2f08p-4f, -0x1.b829a8p-6f,
    0x1.5628eep-8f, -0x1.bcbeap-11f, 0x1.d826b4p-14f, -0x1.43844cp-17f,
};

/* erf(ax) for 0 <= ax < 1 (shared by llm_erff and llm_erff4). */
static inline float erff_small(float ax) {
    float z = ax * ax;
    float p = llm_erf_small[7];
    for (int i = 6; i >= 0; i--) {
        p = llm_erf_small[i] + z * p;
    }
    return ax + ax * p;
}

float LLM_HOT llm_erff(float x) {
    if (x != x) {
        return x + x;
    }
    uint32_t ix = llm_f32_bits(x);
    uint32_t sign = ix & 0x80000000u;
    float ax = llm_f32_from_bits(ix & 0x7fffffffu);
    float y;
    if (ax < 1.0f) {
        y = erff_small(ax);
    } else if (ax < 4.0f) {
        int32_t j = (int32_t)((ax - 1.0f) * 2.0f); /* exact, truncates */
        float mid = 1.25f + 0.5f * (float)j;
        float t = ax - mid;
        const float *c = llm_erf_mid[j];
        float p = c[7];
        for (int i = 6; i >= 0; i--) {
            p = c[i] + t * p;
        }
        y = p;
    } else {
        y = 1.0f;
    }
    return llm_f32_from_bits(llm_f32_bits(y) | sign);
}

/* Lanes with |x| < 1 (where GELU's inputs mostly are) run the small-argument
 * polynomial side by side, the others llm_erff itself: the same operations
 * lane by lane, so the same bits. */
void LLM_HOT llm_erff4(const float x[4], float y[4]) {
    float a[4];
    int small[4];
    for (int i = 0; i < 4; i++) {
        a[i] = llm_f32_from_bits(llm_f32_bits(x[i]) & 0x7fffffffu);
        small[i] = a[i] < 1.0f; /* false for NaN */
        if (!small[i]) a[i] = 0.0f;
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = erff_small(a[i]);
    for (int i = 0; i < 4; i++)
        y[i] = small[i] ? llm_f32_from_bits(llm_f32_bits(a[i]) | (llm_f32_bits(x[i]) & 0x80000000u))
                        : llm_erff(x[i]);
}

/* ---- IEEE half -------------------------------------------------------- */

/* Every finite half through f32_bits.h's exact widening (the one the
 * certified head's fp16 scales use); Inf and NaN keep their sign and payload. */
float llm_half_to_float(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u)
        return llm_f32_from_bits((uint32_t)(h & 0x8000u) << 16 | 0x7F800000u |
                                 (uint32_t)(h & 0x3FFu) << 13);
    return llm_f32_from_bits(llm_f16_to_f32_bits(h));
}
