/*
 * Exact host model of the ESP32-S3 PIE instructions used by pie.h; see
 * pie_model.h for where the state lives, the sources and what is unverified.
 * Source tags in comments: [TRM] [QEMU] [LLVM] as listed in pie_model.h.
 *
 * Signed arithmetic is done on unsigned or 64-bit values so the model has no
 * undefined or implementation-defined behaviour of its own (it runs under
 * UBSan): shifts of negative numbers go through llm_pie_asr64.
 */
#include "pie_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local llm_pie_state tls_state = {.check_align = LLM_PIE_CHECK_ALIGN};

static const char *const op_names[LLM_PIE_OP_COUNT] = {
#define LLM_PIE_OP_NAME_(id, name) name,
    LLM_PIE_OPS(LLM_PIE_OP_NAME_)
#undef LLM_PIE_OP_NAME_
};

llm_pie_state *llm_pie_state_get(void) { return &tls_state; }

void llm_pie_state_reset(void) {
    memset(&tls_state, 0, sizeof tls_state);
    tls_state.check_align = LLM_PIE_CHECK_ALIGN;
}

void llm_pie_check_align_set(int on) { tls_state.check_align = on != 0; }

void llm_pie_counts_reset(void) { memset(tls_state.counts, 0, sizeof tls_state.counts); }

void llm_pie_counts_get(uint64_t counts[LLM_PIE_OP_COUNT]) {
    memcpy(counts, tls_state.counts, sizeof tls_state.counts);
}

uint64_t llm_pie_counts_total(void) {
    uint64_t t = 0;
    for (int i = 0; i < LLM_PIE_OP_COUNT; i++) t += tls_state.counts[i];
    return t;
}

const char *llm_pie_op_name(llm_pie_op op) {
    return (unsigned)op < LLM_PIE_OP_COUNT ? op_names[op] : "?";
}

/* ---- helpers ---- */

static llm_pie_state *begin(llm_pie_op op) {
    tls_state.counts[op]++;
    return &tls_state;
}

/* A debug stop, never an engine error path: it fires only when a kernel
 * issues an instruction the S3 would execute differently from what the
 * programmer meant (misaligned access) or that the model cannot vouch for. */
static void fail(llm_pie_op op, const char *what, uintptr_t value) {
    fprintf(stderr, "pie model: %s: %s (0x%lx)\n", op_names[op], what, (unsigned long)value);
    fflush(stderr);
    abort();
}

static int64_t asr64(int64_t v, unsigned sh) {
    /* floor(v / 2^sh) without relying on >> of a negative value */
    return v >= 0 ? (int64_t)((uint64_t)v >> sh) : -(int64_t)((uint64_t)(-(v + 1)) >> sh) - 1;
}

static int64_t sext40(uint64_t u) {
    u &= 0xFFFFFFFFFFull;
    return (u & 0x8000000000ull) ? (int64_t)(u | 0xFFFFFF0000000000ull) : (int64_t)u;
}

static int64_t clamp40(int64_t v) {
    /* [TRM] EE.VMULAS.S8.ACCX: ACCX = min(max(sum, -2^39), 2^39-1) */
    const int64_t hi = ((int64_t)1 << 39) - 1, lo = -((int64_t)1 << 39);
    return v > hi ? hi : (v < lo ? lo : v);
}

static int32_t sat32(int64_t v) {
    return v > INT32_MAX ? INT32_MAX : (v < INT32_MIN ? INT32_MIN : (int32_t)v);
}

static int8_t s8(const uint8_t *q, int k) { return (int8_t)q[k]; }

static int16_t s16(const uint8_t *q, int k) {
    return (int16_t)(uint16_t)(q[2 * k] | (uint16_t)q[2 * k + 1] << 8);
}

static uint32_t u32lane(const uint8_t *q, int k) {
    return (uint32_t)q[4 * k] | (uint32_t)q[4 * k + 1] << 8 | (uint32_t)q[4 * k + 2] << 16 |
           (uint32_t)q[4 * k + 3] << 24;
}

static void put_u32lane(uint8_t *q, int k, uint32_t v) {
    for (int b = 0; b < 4; b++) q[4 * k + b] = (uint8_t)(v >> (8 * b));
}

/* [TRM] 1.5.3 / every load-store entry: the access address has its low bits
 * forced to 0 ("load128({as[31:4], 4{0}})"); the post-increment is applied to
 * the original register value ("as = as + imm"). */
static uintptr_t mask_addr(llm_pie_state *st, llm_pie_op op, const void *as, uintptr_t low) {
    uintptr_t a = (uintptr_t)as;
    if ((a & low) && st->check_align)
        fail(op, "address not aligned: the S3 ignores its low bits and would access the "
                 "rounded-down address (LLM_PIE_CHECK_ALIGN)", a);
    return a & ~low;
}

static void *advance(const void *as, intptr_t inc) {
    return (void *)((uintptr_t)as + (uintptr_t)inc);
}

/* An instruction that shifts by SAR, begun: SAR >= 32 is not modelled. */
static llm_pie_state *begin_sar(llm_pie_op op) {
    llm_pie_state *st = begin(op);
    if (st->sar > 31)
        fail(op, "SAR >= 32 is not modelled (silicon behaviour unverified)", st->sar);
    return st;
}

/* ---- loads and stores ---- */

void *llm_pie_m_vld_128(llm_pie_op op, int qu, const void *as, intptr_t inc) {
    llm_pie_state *st = begin(op);
    uintptr_t a = mask_addr(st, op, as, 15);
    memcpy(st->q[qu], (const void *)a, 16);
    return advance(as, inc);
}

void *llm_pie_m_vst_128(llm_pie_op op, int qv, void *as, intptr_t inc) {
    llm_pie_state *st = begin(op);
    uintptr_t a = mask_addr(st, op, as, 15);
    memcpy((void *)a, st->q[qv], 16);
    return advance(as, inc);
}

/* [TRM] EE.VLDBC.8/16/32: load 8/16/32 bits (address low 0/1/2 bits forced
 * to 0) and replicate into all 16/8/4 lanes of qu. The bare forms do not
 * write the address register back in this model (pie.h hands them a copy, so
 * code cannot depend on it either way: the published summaries disagree). */
void *llm_pie_m_vldbc(llm_pie_op op, int bits, int qu, const void *as, intptr_t inc) {
    llm_pie_state *st = begin(op);
    int bytes = bits / 8;
    uintptr_t a = mask_addr(st, op, as, (uintptr_t)(bytes - 1));
    uint8_t v[4];
    memcpy(v, (const void *)a, (size_t)bytes);
    for (int k = 0; k < 16; k++) st->q[qu][k] = v[k % bytes];
    return advance(as, inc);
}

/* ---- zero / move ---- */

void llm_pie_m_zero_accx(void) { begin(LLM_PIE_OP_EE_ZERO_ACCX)->accx = 0; }

void llm_pie_m_zero_qacc(void) {
    llm_pie_state *st = begin(LLM_PIE_OP_EE_ZERO_QACC);
    memset(st->qacc_l, 0, sizeof st->qacc_l);
    memset(st->qacc_h, 0, sizeof st->qacc_h);
}

void llm_pie_m_zero_q(int qa) { memset(begin(LLM_PIE_OP_EE_ZERO_Q)->q[qa], 0, 16); }

void llm_pie_m_mv_qr(int qu, int qs) {
    llm_pie_state *st = begin(LLM_PIE_OP_MV_QR);
    memmove(st->q[qu], st->q[qs], 16);
}

/* ---- multiply-accumulate into ACCX ---- */

static void mac_accx(llm_pie_state *st, int lane_bits, int qx, int qy) {
    /* [TRM] EE.VMULAS.S8.ACCX: sum[40:0] = ACCX + the 16 signed 8x8 products,
     * then ACCX = min(max(sum, -2^39), 2^39-1): ONE saturation after the
     * whole 16-product sum. S16: 8 signed 16x16 products, same rule. */
    int64_t sum = st->accx;
    if (lane_bits == 8) {
        for (int k = 0; k < 16; k++) sum += (int32_t)s8(st->q[qx], k) * s8(st->q[qy], k);
    } else {
        for (int k = 0; k < 8; k++) sum += (int32_t)s16(st->q[qx], k) * s16(st->q[qy], k);
    }
    st->accx = clamp40(sum);
}

void llm_pie_m_vmulas_accx(llm_pie_op op, int lane_bits, int qx, int qy) {
    mac_accx(begin(op), lane_bits, qx, qy);
}

/* [TRM] EE.VMULAS.S8.ACCX.LD.IP qu, as, imm, qx, qy: the MAC of qx, qy, and a
 * 128-bit load into qu from {as[31:4],0000}, then as += imm. The MAC reads
 * qx/qy before qu is written ([QEMU] does the MAC first, then the load), so
 * qu may equal qx or qy. */
void *llm_pie_m_vmulas_accx_ld(llm_pie_op op, int lane_bits, int qu, const void *as,
                               intptr_t inc, int qx, int qy) {
    llm_pie_state *st = begin(op);
    uintptr_t a = mask_addr(st, op, as, 15);
    mac_accx(st, lane_bits, qx, qy);
    memcpy(st->q[qu], (const void *)a, 16);
    return advance(as, inc);
}

/* [TRM] EE.SRS.ACCX au, as, 0: ACCX = ACCX >> as[5:0] (arithmetic, no
 * rounding), written back into ACCX; au = the shifted value saturated to
 * 32 bits. Only sel 0 is modelled (pie.h rejects others at compile time). */
int32_t llm_pie_m_srs_accx(uint32_t as, int sel) {
    llm_pie_state *st = begin(LLM_PIE_OP_EE_SRS_ACCX);
    (void)sel;
    st->accx = asr64(st->accx, as & 63u);
    return sat32(st->accx);
}

/* [TRM] RUR.ACCX_0: ACCX[31:0]. RUR.ACCX_1: ACCX[39:32] in bits 7:0; the
 * model fills bits 31:8 with copies of bit 39 (unverified, see header). */
uint32_t llm_pie_m_rur_accx_0(void) {
    return (uint32_t)(uint64_t)begin(LLM_PIE_OP_RUR_ACCX_0)->accx;
}

uint32_t llm_pie_m_rur_accx_1(void) {
    return (uint32_t)((uint64_t)begin(LLM_PIE_OP_RUR_ACCX_1)->accx >> 32);
}

void llm_pie_m_wur_accx_0(uint32_t as) {
    llm_pie_state *st = begin(LLM_PIE_OP_WUR_ACCX_0);
    st->accx = sext40(((uint64_t)st->accx & 0xFF00000000ull) | as);
}

void llm_pie_m_wur_accx_1(uint32_t as) {
    llm_pie_state *st = begin(LLM_PIE_OP_WUR_ACCX_1);
    st->accx = sext40(((uint64_t)(as & 0xFFu) << 32) | ((uint64_t)st->accx & 0xFFFFFFFFull));
}

uint32_t llm_pie_m_rur_sar_byte(void) { return begin(LLM_PIE_OP_RUR_SAR_BYTE)->sar_byte; }

void llm_pie_m_wur_sar_byte(uint32_t as) {
    begin(LLM_PIE_OP_WUR_SAR_BYTE)->sar_byte = as & 15u; /* [TRM] SAR_BYTE is 4 bits */
}

/* [QEMU] EE.MOVI.32.A qs, au, sel4: au = qs[32*sel+31 : 32*sel];
 * EE.MOVI.32.Q qu, as, sel4: qu[32*sel+31 : 32*sel] = as, other lanes kept. */
uint32_t llm_pie_m_movi_32_a(int qs, int sel) {
    return u32lane(begin(LLM_PIE_OP_EE_MOVI_32_A)->q[qs], sel);
}

void llm_pie_m_movi_32_q(int qu, uint32_t as, int sel) {
    put_u32lane(begin(LLM_PIE_OP_EE_MOVI_32_Q)->q[qu], sel, as);
}

/* ---- bitwise, shifts, lane ops ---- */

void llm_pie_m_bitwise(llm_pie_op op, int qa, int qx, int qy) {
    llm_pie_state *st = begin(op);
    uint8_t r[16];
    for (int k = 0; k < 16; k++) {
        uint8_t x = st->q[qx][k], y = st->q[qy][k];
        r[k] = op == LLM_PIE_OP_EE_ANDQ  ? (uint8_t)(x & y)
               : op == LLM_PIE_OP_EE_ORQ ? (uint8_t)(x | y)
               : op == LLM_PIE_OP_EE_XORQ ? (uint8_t)(x ^ y)
                                          : (uint8_t)~x; /* EE.NOTQ qa, qx */
    }
    memcpy(st->q[qa], r, 16);
}

/* [TRM] EE.VSL.32 / EE.VSR.32 qa, qs: the four 32-bit lanes shifted by
 * SAR[5:0]; left fills zeros, right is arithmetic (sign fill). [QEMU] reads
 * the core SAR (not SAR_BYTE). */
void llm_pie_m_vshift_32(llm_pie_op op, int qa, int qs) {
    llm_pie_state *st = begin_sar(op);
    uint8_t r[16];
    for (int k = 0; k < 4; k++) {
        uint32_t v = u32lane(st->q[qs], k);
        uint32_t out = op == LLM_PIE_OP_EE_VSL_32
                           ? v << st->sar
                           : (uint32_t)asr64((int64_t)(int32_t)v, st->sar);
        put_u32lane(r, k, out);
    }
    memcpy(st->q[qa], r, 16);
}

/* [TRM] EE.VMUL.S8 qz, qx, qy: qz[k] = (qx[k] * qy[k]) >> SAR[5:0], the
 * product signed 16-bit, the shift arithmetic, the low 8 bits kept (no
 * saturation in the TRM text; unverified on silicon). */
void llm_pie_m_vmul_s8(int qz, int qx, int qy) {
    llm_pie_state *st = begin_sar(LLM_PIE_OP_EE_VMUL_S8);
    uint8_t r[16];
    for (int k = 0; k < 16; k++) {
        int64_t p = (int64_t)s8(st->q[qx], k) * s8(st->q[qy], k);
        r[k] = (uint8_t)(uint64_t)asr64(p, st->sar);
    }
    memcpy(st->q[qz], r, 16);
}

/* [QEMU] EE.VZIP.8 qs0, qs1: with a = old qs0, b = old qs1,
 *   qs0 = a0 b0 a1 b1 ... a7 b7      (byte 0 first)
 *   qs1 = a8 b8 a9 b9 ... a15 b15
 * so each 16-bit lane of the result is {low byte from qs0, high from qs1}.
 * EE.VUNZIP.8 is the inverse: qs0 = even bytes of (a, then b), qs1 = odd. */
void llm_pie_m_vzip_8(llm_pie_op op, int qs0, int qs1) {
    llm_pie_state *st = begin(op);
    uint8_t a[16], b[16];
    memcpy(a, st->q[qs0], 16);
    memcpy(b, st->q[qs1], 16);
    for (int i = 0; i < 8; i++) {
        if (op == LLM_PIE_OP_EE_VZIP_8) {
            st->q[qs0][2 * i] = a[i];
            st->q[qs0][2 * i + 1] = b[i];
            st->q[qs1][2 * i] = a[i + 8];
            st->q[qs1][2 * i + 1] = b[i + 8];
        } else {
            st->q[qs0][i] = a[2 * i];
            st->q[qs0][i + 8] = b[2 * i];
            st->q[qs1][i] = a[2 * i + 1];
            st->q[qs1][i + 8] = b[2 * i + 1];
        }
    }
}

/* [TRM] EE.VCMP.LT.S8 qa, qx, qy: qa[k] = qx[k] < qy[k] (signed) ? 0xFF : 0. */
void llm_pie_m_vcmp_lt_s8(int qa, int qx, int qy) {
    llm_pie_state *st = begin(LLM_PIE_OP_EE_VCMP_LT_S8);
    uint8_t r[16];
    for (int k = 0; k < 16; k++) r[k] = s8(st->q[qx], k) < s8(st->q[qy], k) ? 0xFF : 0;
    memcpy(st->q[qa], r, 16);
}

/* [TRM] EE.VADDS.S8: min(max(qx + qy, -2^7), 2^7-1) per lane (silicon gives
 * 0x80 on the negative rail; QEMU's -127 is a known divergence). */
void llm_pie_m_vadds_s8(int qa, int qx, int qy) {
    llm_pie_state *st = begin(LLM_PIE_OP_EE_VADDS_S8);
    uint8_t r[16];
    for (int k = 0; k < 16; k++) {
        int v = s8(st->q[qx], k) + s8(st->q[qy], k);
        v = v > 127 ? 127 : (v < -128 ? -128 : v);
        r[k] = (uint8_t)(int8_t)v;
    }
    memcpy(st->q[qa], r, 16);
}

/* [TRM] EE.SRC.Q qa, qs0, qs1: qa = ({qs1, qs0} >> (SAR_BYTE * 8))[127:0],
 * i.e. qa byte k = byte k+SAR_BYTE of the 32-byte concatenation with qs0
 * first. qs0 and qs1 are unchanged (that roll is the .qup form). */
void llm_pie_m_src_q(int qa, int qs0, int qs1) {
    llm_pie_state *st = begin(LLM_PIE_OP_EE_SRC_Q);
    uint8_t cat[32];
    memcpy(cat, st->q[qs0], 16);
    memcpy(cat + 16, st->q[qs1], 16);
    memcpy(st->q[qa], cat + st->sar_byte, 16);
}

/* Core ISA: WSR.SAR writes SAR[5:0]; SSAI imm (0..31) sets SAR = imm. */
void llm_pie_m_wsr_sar(uint32_t as) { begin(LLM_PIE_OP_WSR_SAR)->sar = as & 63u; }

void llm_pie_m_ssai(int imm) { begin(LLM_PIE_OP_SSAI)->sar = (uint32_t)imm; }

void llm_pie_m_nop(void) { begin(LLM_PIE_OP_NOP); }
