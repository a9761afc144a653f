/*
 * ESP32-S3 PIE (SIMD) instructions as C macros: one macro per instruction,
 * named after its mnemonic (dots become underscores, upper case), operands in
 * the assembler's order:
 *   - q registers as literal numbers 0..7:      EE_ANDQ(2, 0, 1)
 *   - address registers as pointer lvalues, updated in place exactly like
 *     the post-increment of the instruction:   EE_VLD_128_IP(0, w, 16)
 *   - immediates as literals:                   SSAI(4)
 *   - value registers as expressions (inputs) or lvalues (outputs):
 *     RUR_ACCX_0(v), WSR_SAR(n), EE_SRS_ACCX(v, n, 0)
 *
 * Two flavours behind the same macros:
 *   - native (LLM_PIE_NATIVE defined by the ESP32-S3 build): each macro is
 *     one `asm volatile` statement in the exact assembler syntax. q registers
 *     are never named in clobber lists (the compiler does not allocate them).
 *   - host (everything else): each macro calls the exact C model in
 *     pie_model.c, which also counts executed instructions per mnemonic.
 * Immediates and q numbers are checked with _Static_assert in both flavours
 * against the assembler's accepted ranges ([LLVM] tests of Espressif's Xtensa
 * assembler, [TRM] syntax lines), so a host build fails on what the S3
 * assembler would reject.
 *
 * SAR rule: ee.vsl.32, ee.vsr.32 and ee.vmul.s8 read the core's
 * SAR, which the compiler also uses for its own variable and 64-bit shifts.
 * Between SSAI/WSR_SAR and the instruction that consumes SAR, kernel C code
 * must not contain variable shifts, 64-bit shifts or calls. (GCC for Xtensa
 * sets SAR inside the same instruction pattern that uses it, so it never
 * expects SAR to survive our asm, but its shifts would overwrite ours.)
 *
 * Coprocessor rules: never from an ISR; assume PIE state does not
 * survive a blocking call; read ACCX after two NOPs following the last MAC.
 */
#ifndef LLM_PIE_H
#define LLM_PIE_H

#include <stdint.h>

/* ---- compile-time operand checks (both flavours) ---- */
#define LLM_PIE_Q(q) _Static_assert((q) >= 0 && (q) <= 7, "PIE q register must be a literal 0..7")
#define LLM_PIE_IMM(imm, lo, hi, step)                                         \
    _Static_assert((imm) >= (lo) && (imm) <= (hi) && (imm) % (step) == 0,      \
                   "PIE immediate out of the assembler's range [" #lo ", " #hi \
                   "] step " #step)

#if defined(SSAI) || defined(WSR_SAR) || defined(NOP) || defined(MV_QR) || \
    defined(RUR_ACCX_0) || defined(WUR_ACCX_0)
#error "pie.h: a core-ISA macro name (SSAI, WSR_SAR, NOP, MV_QR, RUR_/WUR_ACCX_*) is already defined"
#endif

#if defined(LLM_PIE_NATIVE)
/* ======================= native: inline assembly ======================== */
#if !defined(__XTENSA__)
#error "LLM_PIE_NATIVE needs an Xtensa (ESP32-S3) compiler"
#endif
#define LLM_PIE_FLAVOUR "pie-native"

#define EE_VLD_128_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, -2048, 2032, 16); \
    __asm__ volatile("ee.vld.128.ip q" #qu ", %0, " #imm : "+a"(as) : : "memory"); } while (0)
#define EE_VLD_128_XP(qu, as, ad) do { LLM_PIE_Q(qu); \
    __asm__ volatile("ee.vld.128.xp q" #qu ", %0, %1" : "+a"(as) : "a"(ad) : "memory"); } while (0)
#define EE_VST_128_IP(qv, as, imm) do { LLM_PIE_Q(qv); LLM_PIE_IMM(imm, -2048, 2032, 16); \
    __asm__ volatile("ee.vst.128.ip q" #qv ", %0, " #imm : "+a"(as) : : "memory"); } while (0)
#define EE_VST_128_XP(qv, as, ad) do { LLM_PIE_Q(qv); \
    __asm__ volatile("ee.vst.128.xp q" #qv ", %0, %1" : "+a"(as) : "a"(ad) : "memory"); } while (0)
/* bare broadcast loads get a copy of the address: published summaries
 * disagree on whether they write it back, so no code may rely on it */
#define LLM_PIE_VLDBC_BARE(bits, qu, as) do { LLM_PIE_Q(qu); const void *llm_pie_a_ = (as); \
    __asm__ volatile("ee.vldbc." #bits " q" #qu ", %0" : "+a"(llm_pie_a_) : : "memory"); } while (0)
#define EE_VLDBC_8(qu, as) LLM_PIE_VLDBC_BARE(8, qu, as)
#define EE_VLDBC_16(qu, as) LLM_PIE_VLDBC_BARE(16, qu, as)
#define EE_VLDBC_32(qu, as) LLM_PIE_VLDBC_BARE(32, qu, as)
#define EE_VLDBC_8_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, 0, 127, 1); \
    __asm__ volatile("ee.vldbc.8.ip q" #qu ", %0, " #imm : "+a"(as) : : "memory"); } while (0)
#define EE_VLDBC_16_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, 0, 254, 2); \
    __asm__ volatile("ee.vldbc.16.ip q" #qu ", %0, " #imm : "+a"(as) : : "memory"); } while (0)
#define EE_VLDBC_32_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, -512, 508, 4); \
    __asm__ volatile("ee.vldbc.32.ip q" #qu ", %0, " #imm : "+a"(as) : : "memory"); } while (0)
#define EE_ZERO_ACCX() __asm__ volatile("ee.zero.accx")
#define EE_ZERO_QACC() __asm__ volatile("ee.zero.qacc")
#define EE_ZERO_Q(qa) do { LLM_PIE_Q(qa); __asm__ volatile("ee.zero.q q" #qa); } while (0)
#define MV_QR(qu, qs) do { LLM_PIE_Q(qu); LLM_PIE_Q(qs); \
    __asm__ volatile("mv.qr q" #qu ", q" #qs); } while (0)
#define LLM_PIE_MAC(m, qx, qy) do { LLM_PIE_Q(qx); LLM_PIE_Q(qy); \
    __asm__ volatile(m " q" #qx ", q" #qy); } while (0)
#define LLM_PIE_MAC_IP(m, qu, as, imm, qx, qy) do { LLM_PIE_Q(qu); LLM_PIE_Q(qx); LLM_PIE_Q(qy); \
    LLM_PIE_IMM(imm, -512, 496, 16); \
    __asm__ volatile(m " q" #qu ", %0, " #imm ", q" #qx ", q" #qy : "+a"(as) : : "memory"); } while (0)
#define LLM_PIE_MAC_XP(m, qu, as, ad, qx, qy) do { LLM_PIE_Q(qu); LLM_PIE_Q(qx); LLM_PIE_Q(qy); \
    __asm__ volatile(m " q" #qu ", %0, %1, q" #qx ", q" #qy : "+a"(as) : "a"(ad) : "memory"); } while (0)
#define EE_VMULAS_S8_ACCX(qx, qy) LLM_PIE_MAC("ee.vmulas.s8.accx", qx, qy)
#define EE_VMULAS_S8_ACCX_LD_IP(qu, as, imm, qx, qy) \
    LLM_PIE_MAC_IP("ee.vmulas.s8.accx.ld.ip", qu, as, imm, qx, qy)
#define EE_VMULAS_S8_ACCX_LD_XP(qu, as, ad, qx, qy) \
    LLM_PIE_MAC_XP("ee.vmulas.s8.accx.ld.xp", qu, as, ad, qx, qy)
#define EE_VMULAS_S16_ACCX(qx, qy) LLM_PIE_MAC("ee.vmulas.s16.accx", qx, qy)
#define EE_VMULAS_S16_ACCX_LD_IP(qu, as, imm, qx, qy) \
    LLM_PIE_MAC_IP("ee.vmulas.s16.accx.ld.ip", qu, as, imm, qx, qy)
#define EE_VMULAS_S16_ACCX_LD_XP(qu, as, ad, qx, qy) \
    LLM_PIE_MAC_XP("ee.vmulas.s16.accx.ld.xp", qu, as, ad, qx, qy)
#define EE_SRS_ACCX(au, as, sel) do { LLM_PIE_IMM(sel, 0, 0, 1); \
    __asm__ volatile("ee.srs.accx %0, %1, " #sel : "=a"(au) : "a"(as)); } while (0)
#define RUR_ACCX_0(ar) __asm__ volatile("rur.accx_0 %0" : "=a"(ar))
#define RUR_ACCX_1(ar) __asm__ volatile("rur.accx_1 %0" : "=a"(ar))
#define WUR_ACCX_0(as) __asm__ volatile("wur.accx_0 %0" : : "a"(as))
#define WUR_ACCX_1(as) __asm__ volatile("wur.accx_1 %0" : : "a"(as))
#define RUR_SAR_BYTE(ar) __asm__ volatile("rur.sar_byte %0" : "=a"(ar))
#define WUR_SAR_BYTE(as) __asm__ volatile("wur.sar_byte %0" : : "a"(as))
#define EE_MOVI_32_A(qs, au, sel) do { LLM_PIE_Q(qs); LLM_PIE_IMM(sel, 0, 3, 1); \
    __asm__ volatile("ee.movi.32.a q" #qs ", %0, " #sel : "=a"(au)); } while (0)
#define EE_MOVI_32_Q(qu, as, sel) do { LLM_PIE_Q(qu); LLM_PIE_IMM(sel, 0, 3, 1); \
    __asm__ volatile("ee.movi.32.q q" #qu ", %0, " #sel : : "a"(as)); } while (0)
#define LLM_PIE_Q3(m, a, x, y) do { LLM_PIE_Q(a); LLM_PIE_Q(x); LLM_PIE_Q(y); \
    __asm__ volatile(m " q" #a ", q" #x ", q" #y); } while (0)
#define LLM_PIE_Q2(m, a, x) do { LLM_PIE_Q(a); LLM_PIE_Q(x); \
    __asm__ volatile(m " q" #a ", q" #x); } while (0)
#define EE_ANDQ(qa, qx, qy) LLM_PIE_Q3("ee.andq", qa, qx, qy)
#define EE_ORQ(qa, qx, qy) LLM_PIE_Q3("ee.orq", qa, qx, qy)
#define EE_XORQ(qa, qx, qy) LLM_PIE_Q3("ee.xorq", qa, qx, qy)
#define EE_NOTQ(qa, qx) LLM_PIE_Q2("ee.notq", qa, qx)
#define EE_VSL_32(qa, qs) LLM_PIE_Q2("ee.vsl.32", qa, qs)
#define EE_VSR_32(qa, qs) LLM_PIE_Q2("ee.vsr.32", qa, qs)
#define EE_VMUL_S8(qz, qx, qy) LLM_PIE_Q3("ee.vmul.s8", qz, qx, qy)
#define EE_VZIP_8(qs0, qs1) LLM_PIE_Q2("ee.vzip.8", qs0, qs1)
#define EE_VUNZIP_8(qs0, qs1) LLM_PIE_Q2("ee.vunzip.8", qs0, qs1)
#define EE_VCMP_LT_S8(qa, qx, qy) LLM_PIE_Q3("ee.vcmp.lt.s8", qa, qx, qy)
#define EE_VADDS_S8(qa, qx, qy) LLM_PIE_Q3("ee.vadds.s8", qa, qx, qy)
#define EE_SRC_Q(qa, qs0, qs1) LLM_PIE_Q3("ee.src.q", qa, qs0, qs1)
#define WSR_SAR(as) __asm__ volatile("wsr.sar %0" : : "a"(as))
#define SSAI(imm) do { LLM_PIE_IMM(imm, 0, 31, 1); __asm__ volatile("ssai " #imm); } while (0)
#define NOP() __asm__ volatile("nop")

#else
/* ===================== host: exact C model (pie_model.c) ================= */
#include "pie_model.h"
#define LLM_PIE_FLAVOUR "pie-emu"

#define EE_VLD_128_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, -2048, 2032, 16); \
    (as) = llm_pie_m_vld_128(LLM_PIE_OP_EE_VLD_128_IP, (qu), (as), (intptr_t)(imm)); } while (0)
#define EE_VLD_128_XP(qu, as, ad) do { LLM_PIE_Q(qu); \
    (as) = llm_pie_m_vld_128(LLM_PIE_OP_EE_VLD_128_XP, (qu), (as), (intptr_t)(ad)); } while (0)
#define EE_VST_128_IP(qv, as, imm) do { LLM_PIE_Q(qv); LLM_PIE_IMM(imm, -2048, 2032, 16); \
    (as) = llm_pie_m_vst_128(LLM_PIE_OP_EE_VST_128_IP, (qv), (as), (intptr_t)(imm)); } while (0)
#define EE_VST_128_XP(qv, as, ad) do { LLM_PIE_Q(qv); \
    (as) = llm_pie_m_vst_128(LLM_PIE_OP_EE_VST_128_XP, (qv), (as), (intptr_t)(ad)); } while (0)
#define EE_VLDBC_8(qu, as) do { LLM_PIE_Q(qu); \
    (void)llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_8, 8, (qu), (as), 0); } while (0)
#define EE_VLDBC_16(qu, as) do { LLM_PIE_Q(qu); \
    (void)llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_16, 16, (qu), (as), 0); } while (0)
#define EE_VLDBC_32(qu, as) do { LLM_PIE_Q(qu); \
    (void)llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_32, 32, (qu), (as), 0); } while (0)
#define EE_VLDBC_8_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, 0, 127, 1); \
    (as) = llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_8_IP, 8, (qu), (as), (intptr_t)(imm)); } while (0)
#define EE_VLDBC_16_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, 0, 254, 2); \
    (as) = llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_16_IP, 16, (qu), (as), (intptr_t)(imm)); } while (0)
#define EE_VLDBC_32_IP(qu, as, imm) do { LLM_PIE_Q(qu); LLM_PIE_IMM(imm, -512, 508, 4); \
    (as) = llm_pie_m_vldbc(LLM_PIE_OP_EE_VLDBC_32_IP, 32, (qu), (as), (intptr_t)(imm)); } while (0)
#define EE_ZERO_ACCX() llm_pie_m_zero_accx()
#define EE_ZERO_QACC() llm_pie_m_zero_qacc()
#define EE_ZERO_Q(qa) do { LLM_PIE_Q(qa); llm_pie_m_zero_q(qa); } while (0)
#define MV_QR(qu, qs) do { LLM_PIE_Q(qu); LLM_PIE_Q(qs); llm_pie_m_mv_qr((qu), (qs)); } while (0)
#define LLM_PIE_MAC(op, bits, qx, qy) do { LLM_PIE_Q(qx); LLM_PIE_Q(qy); \
    llm_pie_m_vmulas_accx(op, bits, (qx), (qy)); } while (0)
#define LLM_PIE_MAC_IP(op, bits, qu, as, imm, qx, qy) do { LLM_PIE_Q(qu); LLM_PIE_Q(qx); \
    LLM_PIE_Q(qy); LLM_PIE_IMM(imm, -512, 496, 16); \
    (as) = llm_pie_m_vmulas_accx_ld(op, bits, (qu), (as), (intptr_t)(imm), (qx), (qy)); } while (0)
#define LLM_PIE_MAC_XP(op, bits, qu, as, ad, qx, qy) do { LLM_PIE_Q(qu); LLM_PIE_Q(qx); \
    LLM_PIE_Q(qy); \
    (as) = llm_pie_m_vmulas_accx_ld(op, bits, (qu), (as), (intptr_t)(ad), (qx), (qy)); } while (0)
#define EE_VMULAS_S8_ACCX(qx, qy) LLM_PIE_MAC(LLM_PIE_OP_EE_VMULAS_S8_ACCX, 8, qx, qy)
#define EE_VMULAS_S8_ACCX_LD_IP(qu, as, imm, qx, qy) \
    LLM_PIE_MAC_IP(LLM_PIE_OP_EE_VMULAS_S8_ACCX_LD_IP, 8, qu, as, imm, qx, qy)
#define EE_VMULAS_S8_ACCX_LD_XP(qu, as, ad, qx, qy) \
    LLM_PIE_MAC_XP(LLM_PIE_OP_EE_VMULAS_S8_ACCX_LD_XP, 8, qu, as, ad, qx, qy)
#define EE_VMULAS_S16_ACCX(qx, qy) LLM_PIE_MAC(LLM_PIE_OP_EE_VMULAS_S16_ACCX, 16, qx, qy)
#define EE_VMULAS_S16_ACCX_LD_IP(qu, as, imm, qx, qy) \
    LLM_PIE_MAC_IP(LLM_PIE_OP_EE_VMULAS_S16_ACCX_LD_IP, 16, qu, as, imm, qx, qy)
#define EE_VMULAS_S16_ACCX_LD_XP(qu, as, ad, qx, qy) \
    LLM_PIE_MAC_XP(LLM_PIE_OP_EE_VMULAS_S16_ACCX_LD_XP, 16, qu, as, ad, qx, qy)
#define EE_SRS_ACCX(au, as, sel) do { LLM_PIE_IMM(sel, 0, 0, 1); \
    (au) = llm_pie_m_srs_accx((uint32_t)(as), (sel)); } while (0)
#define RUR_ACCX_0(ar) ((ar) = llm_pie_m_rur_accx_0())
#define RUR_ACCX_1(ar) ((ar) = llm_pie_m_rur_accx_1())
#define WUR_ACCX_0(as) llm_pie_m_wur_accx_0((uint32_t)(as))
#define WUR_ACCX_1(as) llm_pie_m_wur_accx_1((uint32_t)(as))
#define RUR_SAR_BYTE(ar) ((ar) = llm_pie_m_rur_sar_byte())
#define WUR_SAR_BYTE(as) llm_pie_m_wur_sar_byte((uint32_t)(as))
#define EE_MOVI_32_A(qs, au, sel) do { LLM_PIE_Q(qs); LLM_PIE_IMM(sel, 0, 3, 1); \
    (au) = llm_pie_m_movi_32_a((qs), (sel)); } while (0)
#define EE_MOVI_32_Q(qu, as, sel) do { LLM_PIE_Q(qu); LLM_PIE_IMM(sel, 0, 3, 1); \
    llm_pie_m_movi_32_q((qu), (uint32_t)(as), (sel)); } while (0)
#define LLM_PIE_BIT(op, qa, qx, qy) do { LLM_PIE_Q(qa); LLM_PIE_Q(qx); LLM_PIE_Q(qy); \
    llm_pie_m_bitwise(op, (qa), (qx), (qy)); } while (0)
#define EE_ANDQ(qa, qx, qy) LLM_PIE_BIT(LLM_PIE_OP_EE_ANDQ, qa, qx, qy)
#define EE_ORQ(qa, qx, qy) LLM_PIE_BIT(LLM_PIE_OP_EE_ORQ, qa, qx, qy)
#define EE_XORQ(qa, qx, qy) LLM_PIE_BIT(LLM_PIE_OP_EE_XORQ, qa, qx, qy)
#define EE_NOTQ(qa, qx) LLM_PIE_BIT(LLM_PIE_OP_EE_NOTQ, qa, qx, qx)
/* The model's two- and three-register operations: each register checked,
 * then the model's function (`op`: which of its operations, where it has
 * several). */
#define LLM_PIE_QQ(fn, op, q0, q1) do { LLM_PIE_Q(q0); LLM_PIE_Q(q1); \
    fn(op, (q0), (q1)); } while (0)
#define LLM_PIE_QQQ(fn, q0, q1, q2) do { LLM_PIE_Q(q0); LLM_PIE_Q(q1); LLM_PIE_Q(q2); \
    fn((q0), (q1), (q2)); } while (0)
#define EE_VSL_32(qa, qs) LLM_PIE_QQ(llm_pie_m_vshift_32, LLM_PIE_OP_EE_VSL_32, qa, qs)
#define EE_VSR_32(qa, qs) LLM_PIE_QQ(llm_pie_m_vshift_32, LLM_PIE_OP_EE_VSR_32, qa, qs)
#define EE_VZIP_8(qs0, qs1) LLM_PIE_QQ(llm_pie_m_vzip_8, LLM_PIE_OP_EE_VZIP_8, qs0, qs1)
#define EE_VUNZIP_8(qs0, qs1) LLM_PIE_QQ(llm_pie_m_vzip_8, LLM_PIE_OP_EE_VUNZIP_8, qs0, qs1)
#define EE_VMUL_S8(qz, qx, qy) LLM_PIE_QQQ(llm_pie_m_vmul_s8, qz, qx, qy)
#define EE_VCMP_LT_S8(qa, qx, qy) LLM_PIE_QQQ(llm_pie_m_vcmp_lt_s8, qa, qx, qy)
#define EE_VADDS_S8(qa, qx, qy) LLM_PIE_QQQ(llm_pie_m_vadds_s8, qa, qx, qy)
#define EE_SRC_Q(qa, qs0, qs1) LLM_PIE_QQQ(llm_pie_m_src_q, qa, qs0, qs1)
#define WSR_SAR(as) llm_pie_m_wsr_sar((uint32_t)(as))
#define SSAI(imm) do { LLM_PIE_IMM(imm, 0, 31, 1); llm_pie_m_ssai(imm); } while (0)
#define NOP() llm_pie_m_nop()

#endif /* LLM_PIE_NATIVE */
#endif
