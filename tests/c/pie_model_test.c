/*
 * Tests of the PIE host model itself (pie_model.c through the pie.h macros),
 * against expectations computed by hand from the instruction descriptions.
 *
 *   pie_model_test            run every check; prints "ok <name>" or
 *                             "FAIL <name>: ..." and exits 1 on any failure
 *   pie_model_test misaligned issue a misaligned ee.vld.128.ip with the
 *                             alignment check on (must abort with a message)
 *   pie_model_test misaligned-mac  same for the fused MAC+load
 *   pie_model_test misaligned-vst  same for ee.vst.128.ip
 *   pie_model_test sar32      ee.vsr.32 with SAR = 32 (unmodelled: must abort)
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <threads.h>

#include "pie.h"

static int failures;

static void check(int ok, const char *name, const char *detail) {
    if (ok) {
        printf("ok %s\n", name);
    } else {
        printf("FAIL %s: %s\n", name, detail);
        failures++;
    }
}

static int q_equals(int q, const uint8_t *want) {
    return memcmp(llm_pie_state_get()->q[q], want, 16) == 0;
}

static void set_q(int q, const void *bytes) { memcpy(llm_pie_state_get()->q[q], bytes, 16); }

static void set_accx(int64_t v) {
    /* through the instructions themselves: low word, then bits 39:32 */
    uint64_t u = (uint64_t)v;
    WUR_ACCX_0((uint32_t)u);
    WUR_ACCX_1((uint32_t)(u >> 32) & 0xFFu);
}

static int64_t get_accx(void) {
    uint32_t lo, hi;
    RUR_ACCX_0(lo);
    RUR_ACCX_1(hi);
    uint64_t u = ((uint64_t)(hi & 0xFFu) << 32) | lo;
    return (u & 0x8000000000ull) ? (int64_t)(u | 0xFFFFFF0000000000ull) : (int64_t)u;
}

static _Alignas(16) uint8_t mem[128];

/* pointer offsets compared as integers: several post-incremented pointers
 * leave the array, as they may on the chip */
static intptr_t off(const void *p) { return (intptr_t)((uintptr_t)p - (uintptr_t)mem); }

static void fill_mem(void) {
    for (int i = 0; i < 128; i++) mem[i] = (uint8_t)i;
}

static void test_address_masking(void) {
    llm_pie_state_reset();
    llm_pie_check_align_set(0);
    fill_mem();
    const uint8_t *p = mem + 16 + 5;
    EE_VLD_128_IP(0, p, 16);
    check(q_equals(0, mem + 16), "vld.128.ip reads the 16-byte block containing the address",
          "q0 != mem[16..31]");
    check(off(p) == 37, "vld.128.ip increments the unmasked pointer", "p != mem+37");
    EE_VLD_128_IP(1, p, -32);
    check(q_equals(1, mem + 32) && off(p) == 5, "vld.128.ip negative step from unmasked",
          "q1 != mem[32..47] or p != mem+5");
    intptr_t step = 7;
    EE_VLD_128_XP(2, p, step);
    check(q_equals(2, mem) && off(p) == 12, "vld.128.xp masks the access, adds ad to as",
          "q2 != mem[0..15] or p != mem+12");

    /* store: writes the rounded-down block, nothing else */
    uint8_t want[128];
    memcpy(want, mem, 128);
    uint8_t pat[16];
    for (int i = 0; i < 16; i++) pat[i] = (uint8_t)(0xA0 + i);
    set_q(3, pat);
    uint8_t *d = mem + 64 + 9;
    EE_VST_128_IP(3, d, 16);
    memcpy(want + 64, pat, 16);
    check(memcmp(mem, want, 128) == 0 && off(d) == 89,
          "vst.128.ip stores to the masked block and increments the unmasked pointer",
          "memory or pointer wrong");
    d = mem + 100;
    step = -3;
    EE_VST_128_XP(3, d, step);
    memcpy(want + 96, pat, 16);
    check(memcmp(mem, want, 128) == 0 && off(d) == 97, "vst.128.xp masks and adds ad",
          "memory or pointer wrong");

    /* fused MAC + load: load masked, increment unmasked */
    fill_mem();
    EE_ZERO_Q(4);
    const uint8_t *f = mem + 48 + 15;
    EE_VMULAS_S8_ACCX_LD_IP(5, f, -16, 4, 4);
    check(q_equals(5, mem + 48) && off(f) == 47, "vmulas.s8.accx.ld.ip masks, step -16 from unmasked",
          "q5 or pointer wrong");
    step = 33;
    EE_VMULAS_S8_ACCX_LD_XP(6, f, step, 4, 4);
    check(q_equals(6, mem + 32) && off(f) == 80, "vmulas.s8.accx.ld.xp masks, adds ad",
          "q6 or pointer wrong");
    EE_VMULAS_S16_ACCX_LD_IP(7, f, 496, 4, 4);
    check(q_equals(7, mem + 80) && off(f) == 576, "vmulas.s16.accx.ld.ip largest step 496",
          "q7 or pointer wrong");

    /* broadcasts: 8-bit uses the address as is, 16/32 drop 1/2 low bits */
    const uint8_t *b = mem + 7;
    EE_VLDBC_8_IP(0, b, 127);
    uint8_t w8[16];
    memset(w8, 7, 16);
    check(q_equals(0, w8) && off(b) == 134, "vldbc.8.ip broadcasts the byte, as += imm",
          "q0 or pointer wrong");
    b = mem + 9;
    EE_VLDBC_16_IP(1, b, 254);
    uint8_t w16[16];
    for (int i = 0; i < 16; i++) w16[i] = (uint8_t)(8 + (i & 1));
    check(q_equals(1, w16) && off(b) == 263, "vldbc.16.ip drops address bit 0, as += imm",
          "q1 or pointer wrong");
    b = mem + 23;
    EE_VLDBC_32_IP(2, b, -512);
    uint8_t w32[16];
    for (int i = 0; i < 16; i++) w32[i] = (uint8_t)(20 + (i & 3));
    check(q_equals(2, w32) && off(b) == 23 - 512, "vldbc.32.ip drops address bits 1:0, signed step",
          "q2 or pointer wrong");
    EE_VLDBC_32(3, mem + 4);
    for (int i = 0; i < 16; i++) w32[i] = (uint8_t)(4 + (i & 3));
    check(q_equals(3, w32), "vldbc.32 broadcasts a word", "q3 wrong");
    EE_VLDBC_16(3, mem + 2);
    for (int i = 0; i < 16; i++) w16[i] = (uint8_t)(2 + (i & 1));
    check(q_equals(3, w16), "vldbc.16 broadcasts a halfword", "q3 wrong");
    EE_VLDBC_8(3, mem + 1);
    memset(w8, 1, 16);
    check(q_equals(3, w8), "vldbc.8 broadcasts a byte", "q3 wrong");
    llm_pie_check_align_set(1);
}

static void test_accx_saturation(void) {
    llm_pie_state_reset();
    int8_t p127[16], m128[16], mix[16];
    for (int i = 0; i < 16; i++) {
        p127[i] = 127;
        m128[i] = -128;
        mix[i] = (int8_t)(i < 8 ? 127 : -127);
    }
    const int64_t top = ((int64_t)1 << 39) - 1, bottom = -((int64_t)1 << 39);
    set_q(0, p127);
    set_q(1, m128);
    set_q(2, mix);

    set_accx(top - 100);
    EE_VMULAS_S8_ACCX(0, 0); /* + 16 * 16129 */
    check(get_accx() == top, "ACCX saturates at 2^39-1", "not clamped to 2^39-1");
    uint32_t lo, hi;
    RUR_ACCX_0(lo);
    RUR_ACCX_1(hi);
    check(lo == 0xFFFFFFFFu && (hi & 0xFF) == 0x7F, "rur.accx_0/1 of 2^39-1",
          "expected 0xFFFFFFFF / 0x7F");

    set_accx(bottom + 100);
    EE_VMULAS_S8_ACCX(0, 1); /* + 16 * -16256 */
    check(get_accx() == bottom, "ACCX saturates at -2^39 (the TRM rail, not QEMU's -(2^39-1))",
          "not clamped to -2^39");
    RUR_ACCX_0(lo);
    RUR_ACCX_1(hi);
    check(lo == 0 && hi == 0xFFFFFF80u, "rur.accx_1 of -2^39: 0x80, bit 39 copied above (model)",
          "expected 0 / 0xFFFFFF80");

    /* one clamp after the 16-product sum: +8*16129 then -8*16129 cancels */
    set_accx(top - 10);
    EE_ZERO_Q(3);
    int8_t ones[16];
    memset(ones, 1, 16);
    set_q(3, ones);
    EE_VMULAS_S8_ACCX(2, 0); /* 8*127*127 - 8*127*127 = 0 */
    check(get_accx() == top - 10, "ACCX clamps once per instruction, after the whole sum",
          "intermediate clamp");

    /* 16-bit MAC: 8 products of int16 */
    int16_t h[8] = {32767, -32768, 2, -3, 0, 1, 1000, -1000};
    int16_t g[8] = {32767, -32768, 5, 7, 99, -1, 1000, 1000};
    set_q(4, h);
    set_q(5, g);
    EE_ZERO_ACCX();
    EE_VMULAS_S16_ACCX(4, 5);
    int64_t want = (int64_t)32767 * 32767 + (int64_t)32768 * 32768 + 10 - 21 + 0 - 1 +
                   1000000 - 1000000;
    check(get_accx() == want, "vmulas.s16.accx sums 8 int16 products", "wrong sum");

    /* wur/rur round trip of a negative 40-bit value */
    set_accx(-5);
    RUR_ACCX_0(lo);
    check(lo == 0xFFFFFFFBu && get_accx() == -5, "wur.accx_0/1 then rur.accx_0 of -5",
          "round trip wrong");
    EE_ZERO_ACCX();
    check(get_accx() == 0, "zero.accx", "ACCX not zero");
}

static void test_srs_accx(void) {
    llm_pie_state_reset();
    int32_t r;
    set_accx(-1000);
    EE_SRS_ACCX(r, 3, 0);
    check(r == -125 && get_accx() == -125, "srs.accx -1000 >> 3 = -125, written back",
          "wrong value or not written back");
    set_accx(-7);
    EE_SRS_ACCX(r, 1, 0);
    check(r == -4 && get_accx() == -4, "srs.accx -7 >> 1 = -4 (floor: no rounding)",
          "rounded");
    set_accx(7);
    EE_SRS_ACCX(r, 1, 0);
    check(r == 3, "srs.accx 7 >> 1 = 3 (no rounding)", "rounded");
    set_accx(((int64_t)1 << 38) + 5);
    EE_SRS_ACCX(r, 0, 0);
    check(r == INT32_MAX && get_accx() == ((int64_t)1 << 38) + 5,
          "srs.accx saturates the result to 32 bits, ACCX keeps the shifted value",
          "not saturated or ACCX changed");
    set_accx(-((int64_t)1 << 38) - 5);
    EE_SRS_ACCX(r, 0, 0);
    check(r == INT32_MIN, "srs.accx saturates negative results to -2^31", "not saturated");
    set_accx(((int64_t)1 << 38) + 5);
    EE_SRS_ACCX(r, 8, 0);
    check(r == (1 << 30), "srs.accx 2^38+5 >> 8 = 2^30", "wrong");
    set_accx(800);
    EE_SRS_ACCX(r, 64 + 3, 0);
    check(r == 100, "srs.accx uses as[5:0] (67 shifts by 3)", "wrong shift amount");
}

static void test_vmul_s8(void) {
    llm_pie_state_reset();
    int8_t x[16] = {100, -100, -3, 127, -128, 1, 0, 2, 100, 100, 100, 100, 100, 100, 100, 100};
    int8_t y[16] = {100, 100, 5, 127, -128, -1, 9, 64, 100, 100, 100, 100, 100, 100, 100, 100};
    set_q(0, x);
    set_q(1, y);
    SSAI(0);
    EE_VMUL_S8(2, 0, 1);
    uint8_t want0[16] = {0x10, 0xF0, 0xF1, 0x01, 0x00, 0xFF, 0x00, 0x80,
                         0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10};
    /* 10000=0x2710 -> 0x10; -10000=0xD8F0 -> 0xF0; -15 -> 0xF1; 16129=0x3F01 -> 0x01;
     * 16384=0x4000 -> 0x00; -1 -> 0xFF; 0; 128 -> 0x80 */
    check(q_equals(2, want0), "vmul.s8 SAR=0 keeps the low byte of the product", "wrong bytes");
    SSAI(4);
    EE_VMUL_S8(2, 0, 1);
    uint8_t want4[16] = {0x71, 0x8F, 0xFF, 0xF0, 0x00, 0xFF, 0x00, 0x08,
                         0x71, 0x71, 0x71, 0x71, 0x71, 0x71, 0x71, 0x71};
    /* 10000>>4=625=0x271; -10000>>4=-625=0xFD8F; -15>>4=-1; 16129>>4=1008=0x3F0;
     * 16384>>4=1024=0x400; -1>>4=-1; 0; 128>>4=8 */
    check(q_equals(2, want4), "vmul.s8 SAR=4: low byte of (product >> SAR), arithmetic shift",
          "wrong bytes");
}

static void test_zip(void) {
    llm_pie_state_reset();
    uint8_t a[16], b[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (uint8_t)i;
        b[i] = (uint8_t)(16 + i);
    }
    set_q(0, a);
    set_q(1, b);
    EE_VZIP_8(0, 1);
    uint8_t z0[16], z1[16];
    for (int i = 0; i < 8; i++) {
        z0[2 * i] = (uint8_t)i;
        z0[2 * i + 1] = (uint8_t)(16 + i);
        z1[2 * i] = (uint8_t)(8 + i);
        z1[2 * i + 1] = (uint8_t)(24 + i);
    }
    check(q_equals(0, z0) && q_equals(1, z1),
          "vzip.8: qs0 = a0 b0 .. a7 b7, qs1 = a8 b8 .. a15 b15", "wrong lane order");
    EE_VUNZIP_8(0, 1);
    check(q_equals(0, a) && q_equals(1, b), "vunzip.8 undoes vzip.8", "not restored");

    /* sign extension int8 -> int16: vcmp.lt.s8 against zero gives the high
     * bytes, vzip.8 interleaves them under the values */
    int8_t v[16] = {-128, -1, 0, 1, 127, -50, 50, -2, 3, -3, 100, -100, 64, -64, 126, -127};
    set_q(2, v);
    EE_ZERO_Q(7);
    EE_VCMP_LT_S8(3, 2, 7);
    EE_VZIP_8(2, 3);
    int16_t lo[8], hi[8];
    memcpy(lo, llm_pie_state_get()->q[2], 16);
    memcpy(hi, llm_pie_state_get()->q[3], 16);
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= lo[i] == v[i] && hi[i] == v[i + 8];
    check(ok, "vcmp.lt.s8 + vzip.8 sign-extends int8 lanes to int16", "wrong int16 lanes");

    uint8_t c[16];
    int8_t p[16] = {5, 0, -1, 127, -128, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, -7};
    int8_t q[16] = {6, 0, -2, -128, 127, 7, 8, 6, 7, 7, 7, 7, 7, 7, 7, 7};
    set_q(4, p);
    set_q(5, q);
    EE_VCMP_LT_S8(6, 4, 5);
    for (int i = 0; i < 16; i++) c[i] = p[i] < q[i] ? 0xFF : 0;
    check(q_equals(6, c), "vcmp.lt.s8 is a signed compare giving 0xFF/0x00", "wrong mask");
}

static void test_vadds_and_bitwise(void) {
    llm_pie_state_reset();
    int8_t x[16] = {100, -100, -128, 127, 5, 0, -1, 64, 64, -64, -65, 1, 2, 3, 4, 5};
    int8_t y[16] = {100, -100, -1, 1, -3, 0, -1, 63, 64, -64, -64, -1, -2, -3, -4, -5};
    int8_t w[16] = {127, -128, -128, 127, 2, 0, -2, 127, 127, -128, -128, 0, 0, 0, 0, 0};
    set_q(0, x);
    set_q(1, y);
    EE_VADDS_S8(2, 0, 1);
    check(q_equals(2, (const uint8_t *)w), "vadds.s8 saturates to [-128, 127]", "wrong sums");

    uint8_t a[16], b[16], and_[16], or_[16], xor_[16], not_[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (uint8_t)(0x5A + 17 * i);
        b[i] = (uint8_t)(0xC3 ^ (29 * i));
        and_[i] = a[i] & b[i];
        or_[i] = a[i] | b[i];
        xor_[i] = a[i] ^ b[i];
        not_[i] = (uint8_t)~a[i];
    }
    set_q(0, a);
    set_q(1, b);
    EE_ANDQ(2, 0, 1);
    EE_ORQ(3, 0, 1);
    EE_XORQ(4, 0, 1);
    EE_NOTQ(5, 0);
    check(q_equals(2, and_) && q_equals(3, or_) && q_equals(4, xor_) && q_equals(5, not_),
          "andq/orq/xorq/notq", "wrong bits");
    EE_ANDQ(0, 0, 1); /* destination may be a source */
    check(q_equals(0, and_), "andq in place", "wrong bits");
    MV_QR(6, 5);
    check(q_equals(6, not_), "mv.qr copies a register", "wrong copy");
}

static void test_shifts_and_movi(void) {
    llm_pie_state_reset();
    uint32_t lanes[4] = {0x80000001u, 0x7FFFFFFFu, 0x12345678u, 0xFFFFFFF0u};
    set_q(0, lanes);
    WSR_SAR(64 + 4); /* SAR is 6 bits: 68 writes 4 */
    check(llm_pie_state_get()->sar == 4, "wsr.sar keeps as[5:0]", "SAR != 4");
    EE_VSR_32(1, 0);
    uint32_t r[4], w[4] = {0xF8000000u, 0x07FFFFFFu, 0x01234567u, 0xFFFFFFFFu};
    memcpy(r, llm_pie_state_get()->q[1], 16);
    check(memcmp(r, w, 16) == 0, "vsr.32 is an arithmetic right shift of 32-bit lanes by SAR",
          "wrong lanes");
    SSAI(8);
    EE_VSL_32(2, 0);
    uint32_t wl[4] = {0x00000100u, 0xFFFFFF00u, 0x34567800u, 0xFFFFF000u};
    memcpy(r, llm_pie_state_get()->q[2], 16);
    check(memcmp(r, wl, 16) == 0, "vsl.32 shifts 32-bit lanes left by SAR, zero fill", "wrong lanes");

    /* the nibble split the matvec kernel relies on: vsr.32 by 4 then & 0x0F
     * yields each byte's high nibble, including the top byte of each lane */
    uint8_t bytes[16], hi[16];
    for (int i = 0; i < 16; i++) {
        bytes[i] = (uint8_t)(0xF7 - 13 * i);
        hi[i] = bytes[i] >> 4;
    }
    uint8_t mask[16];
    memset(mask, 0x0F, 16);
    set_q(3, bytes);
    set_q(4, mask);
    SSAI(4);
    EE_VSR_32(5, 3);
    EE_ANDQ(5, 5, 4);
    check(q_equals(5, hi), "vsr.32 by 4 + andq 0x0F extracts every high nibble", "wrong nibbles");

    uint32_t v;
    EE_MOVI_32_A(0, v, 2);
    check(v == 0x12345678u, "movi.32.a reads 32-bit lane sel (little-endian lanes)", "wrong lane");
    EE_MOVI_32_Q(0, 0xCAFEF00Du, 3);
    uint32_t after[4] = {0x80000001u, 0x7FFFFFFFu, 0x12345678u, 0xCAFEF00Du};
    memcpy(r, llm_pie_state_get()->q[0], 16);
    check(memcmp(r, after, 16) == 0, "movi.32.q writes lane sel only", "wrong lanes");
}

static void test_src_q_and_misc(void) {
    llm_pie_state_reset();
    uint8_t a[16], b[16], want[16];
    for (int i = 0; i < 16; i++) {
        a[i] = (uint8_t)i;
        b[i] = (uint8_t)(16 + i);
    }
    set_q(0, a);
    set_q(1, b);
    WUR_SAR_BYTE(16 + 5); /* 4-bit register */
    uint32_t sb;
    RUR_SAR_BYTE(sb);
    EE_SRC_Q(2, 0, 1);
    for (int i = 0; i < 16; i++) want[i] = (uint8_t)(5 + i);
    check(sb == 5 && q_equals(2, want) && q_equals(0, a) && q_equals(1, b),
          "src.q: bytes SAR_BYTE.. of {qs1,qs0}, sources unchanged", "wrong bytes");
    WUR_SAR_BYTE(0);
    EE_SRC_Q(0, 0, 1);
    check(q_equals(0, a), "src.q with SAR_BYTE 0 is qs0", "wrong");

    /* fused form with qu == qx: the MAC uses the value before the load */
    fill_mem();
    int8_t ones[16];
    memset(ones, 1, 16);
    int8_t twos[16];
    memset(twos, 2, 16);
    set_q(3, twos);
    set_q(4, ones);
    EE_ZERO_ACCX();
    const uint8_t *p = mem;
    EE_VMULAS_S8_ACCX_LD_IP(3, p, 16, 3, 4);
    check(get_accx() == 32 && q_equals(3, mem), "fused MAC reads qx before its load overwrites it",
          "MAC used the loaded value");

    EE_ZERO_Q(3);
    uint8_t zero[16] = {0};
    check(q_equals(3, zero), "zero.q", "not zero");
    llm_pie_state_get()->qacc_l[3] = 77;
    llm_pie_state_get()->qacc_h[7] = -5;
    EE_ZERO_QACC();
    int z = 1;
    for (int i = 0; i < 8; i++) z &= llm_pie_state_get()->qacc_l[i] == 0 &&
                                     llm_pie_state_get()->qacc_h[i] == 0;
    check(z, "zero.qacc clears QACC_L and QACC_H", "not zero");
}

static void test_counts(void) {
    llm_pie_state_reset();
    fill_mem();
    const uint8_t *p = mem;
    llm_pie_counts_reset();
    EE_VLD_128_IP(0, p, 16);
    EE_VLD_128_IP(1, p, 16);
    EE_VMULAS_S8_ACCX(0, 1);
    NOP();
    uint32_t v;
    RUR_ACCX_0(v);
    (void)v;
    uint64_t c[LLM_PIE_OP_COUNT];
    llm_pie_counts_get(c);
    check(c[LLM_PIE_OP_EE_VLD_128_IP] == 2 && c[LLM_PIE_OP_EE_VMULAS_S8_ACCX] == 1 &&
              c[LLM_PIE_OP_NOP] == 1 && c[LLM_PIE_OP_RUR_ACCX_0] == 1 &&
              llm_pie_counts_total() == 5,
          "counters count each executed instruction per mnemonic", "wrong counts");
    check(strcmp(llm_pie_op_name(LLM_PIE_OP_EE_VMULAS_S8_ACCX_LD_IP), "ee.vmulas.s8.accx.ld.ip") == 0,
          "op names are the mnemonics", "wrong name");
    llm_pie_counts_reset();
    check(llm_pie_counts_total() == 0, "counts reset", "not zero");
}

static int other_thread(void *arg) {
    (void)arg;
    /* a fresh thread sees a fresh core: its ACCX is 0 whatever main did */
    int64_t seen = get_accx();
    set_accx(12345);
    return seen == 0 ? 0 : 1;
}

static void test_per_thread_state(void) {
    llm_pie_state_reset();
    set_accx(-777);
    thrd_t t;
    int rc = -1;
    if (thrd_create(&t, other_thread, NULL) == thrd_success) thrd_join(t, &rc);
    check(rc == 0 && get_accx() == -777, "model state is per thread (one core per thread)",
          "state shared between threads");
}

int main(int argc, char **argv) {
    if (argc > 1) {
        llm_pie_state_reset();
        fill_mem();
        const uint8_t *p = mem + 3;
        uint8_t *d = mem + 40;
        if (strcmp(argv[1], "misaligned") == 0) {
            EE_VLD_128_IP(0, p, 16);
        } else if (strcmp(argv[1], "misaligned-mac") == 0) {
            EE_VMULAS_S8_ACCX_LD_IP(0, p, 16, 1, 2);
        } else if (strcmp(argv[1], "misaligned-vst") == 0) {
            EE_VST_128_IP(0, d, 16);
        } else if (strcmp(argv[1], "sar32") == 0) {
            WSR_SAR(32);
            EE_VSR_32(0, 1);
        } else {
            fprintf(stderr, "unknown mode %s\n", argv[1]);
            return 2;
        }
        printf("no abort\n");
        return 0;
    }
    test_address_masking();
    test_accx_saturation();
    test_srs_accx();
    test_vmul_s8();
    test_zip();
    test_vadds_and_bitwise();
    test_shifts_and_movi();
    test_src_q_and_misc();
    test_counts();
    test_per_thread_state();
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
