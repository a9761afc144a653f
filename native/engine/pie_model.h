/*
 * Exact host model of the ESP32-S3 PIE instructions that pie.h exposes.
 *
 * Used when pie.h is NOT in native mode (every host build): each pie.h macro
 * calls one llm_pie_m_* function below, which updates the modelled registers
 * exactly as the instruction would. Never compiled into a device build.
 *
 * Where the state lives (a deliberate decision): one llm_pie_state per THREAD,
 * a _Thread_local object inside pie_model.c. The state models a core's
 * registers (q0-q7, ACCX, QACC, SAR, SAR_BYTE), and on the chip each core has
 * its own; a host thread standing in for a core gets its own copy the same
 * way. Engine code (the kernels) owns no state: like on the board, it just
 * issues instructions. This is the host emulator's "one global state" of
 * pie.h, made per-thread so a host run that splits a matvec across two
 * threads behaves like the two cores.
 *
 * Semantics and sources (facts only, restated in pie_model.c where used):
 *   [TRM]  ESP32-S3 Technical Reference Manual, chapter 1 "Processor
 *          Instruction Extensions (PIE)", instruction entries 1.8.x (as
 *          extracted in Espressif's esp-dl repository,
 *          tools/agents/skills/esp32s3-pie-simd/references/pie_instruction_set.md).
 *   [QEMU] Espressif's QEMU, target/xtensa/translate_tie_esp32s3.c (lane
 *          orders of vzip/vunzip, which SAR each op reads, operand order).
 *   [LLVM] Espressif's LLVM Xtensa assembler tests (immediate ranges, e.g.
 *          "expected immediate in range [-512, 496], first 4 bits should be
 *          zero" for the fused .ld.ip forms).
 * Known QEMU divergences from silicon we do NOT copy: QEMU clamps signed
 * saturating results at -(2^(n-1)-1); hardware comparisons published against
 * Espressif QEMU 9.2.2 show silicon uses -2^(n-1) (vadds.s8 gives 0x80, the
 * 20-bit QACC rail is -2^19), which is also what the TRM pseudo-code says
 * (min(max(sum, -2^39), 2^39-1) for ACCX).
 *
 * Unverified on silicon (selftest.c prints what the board does):
 *   - rur.accx_1 upper 24 bits: the model returns bit 39 copied into them
 *     (what QEMU's 64-bit container gives). Kernels must mask to 8 bits.
 *   - ee.srs.accx saturation: the model saturates the returned value to
 *     32 bits as the TRM says (ACCX itself keeps the unsaturated shift).
 *   - ee.vmul.s8: the model keeps the low byte of (product >> SAR).
 * Not modelled (the model aborts with a message rather than guess): SAR >= 32
 * for ee.vsl.32 / ee.vsr.32 / ee.vmul.s8 (QEMU and silicon are reported to
 * differ there, espressif/qemu issue #163).
 */
#ifndef LLM_PIE_MODEL_H
#define LLM_PIE_MODEL_H

#include <stdint.h>

/* Every modelled mnemonic, in one list: the op enum, the names printed by the
 * counters and the per-op count slots all come from it. */
#define LLM_PIE_OPS(X)                                         \
    X(EE_VLD_128_IP, "ee.vld.128.ip")                          \
    X(EE_VLD_128_XP, "ee.vld.128.xp")                          \
    X(EE_VST_128_IP, "ee.vst.128.ip")                          \
    X(EE_VST_128_XP, "ee.vst.128.xp")                          \
    X(EE_VLDBC_8, "ee.vldbc.8")                                \
    X(EE_VLDBC_8_IP, "ee.vldbc.8.ip")                          \
    X(EE_VLDBC_16, "ee.vldbc.16")                              \
    X(EE_VLDBC_16_IP, "ee.vldbc.16.ip")                        \
    X(EE_VLDBC_32, "ee.vldbc.32")                              \
    X(EE_VLDBC_32_IP, "ee.vldbc.32.ip")                        \
    X(EE_ZERO_ACCX, "ee.zero.accx")                            \
    X(EE_ZERO_QACC, "ee.zero.qacc")                            \
    X(EE_ZERO_Q, "ee.zero.q")                                  \
    X(MV_QR, "mv.qr")                                          \
    X(EE_VMULAS_S8_ACCX, "ee.vmulas.s8.accx")                  \
    X(EE_VMULAS_S8_ACCX_LD_IP, "ee.vmulas.s8.accx.ld.ip")      \
    X(EE_VMULAS_S8_ACCX_LD_XP, "ee.vmulas.s8.accx.ld.xp")      \
    X(EE_VMULAS_S16_ACCX, "ee.vmulas.s16.accx")                \
    X(EE_VMULAS_S16_ACCX_LD_IP, "ee.vmulas.s16.accx.ld.ip")    \
    X(EE_VMULAS_S16_ACCX_LD_XP, "ee.vmulas.s16.accx.ld.xp")    \
    X(EE_SRS_ACCX, "ee.srs.accx")                              \
    X(RUR_ACCX_0, "rur.accx_0")                                \
    X(RUR_ACCX_1, "rur.accx_1")                                \
    X(WUR_ACCX_0, "wur.accx_0")                                \
    X(WUR_ACCX_1, "wur.accx_1")                                \
    X(RUR_SAR_BYTE, "rur.sar_byte")                            \
    X(WUR_SAR_BYTE, "wur.sar_byte")                            \
    X(EE_MOVI_32_A, "ee.movi.32.a")                            \
    X(EE_MOVI_32_Q, "ee.movi.32.q")                            \
    X(EE_ANDQ, "ee.andq")                                      \
    X(EE_ORQ, "ee.orq")                                        \
    X(EE_XORQ, "ee.xorq")                                      \
    X(EE_NOTQ, "ee.notq")                                      \
    X(EE_VSL_32, "ee.vsl.32")                                  \
    X(EE_VSR_32, "ee.vsr.32")                                  \
    X(EE_VMUL_S8, "ee.vmul.s8")                                \
    X(EE_VZIP_8, "ee.vzip.8")                                  \
    X(EE_VUNZIP_8, "ee.vunzip.8")                              \
    X(EE_VCMP_LT_S8, "ee.vcmp.lt.s8")                          \
    X(EE_VADDS_S8, "ee.vadds.s8")                              \
    X(EE_SRC_Q, "ee.src.q")                                    \
    X(WSR_SAR, "wsr.sar")                                      \
    X(SSAI, "ssai")                                            \
    X(NOP, "nop")

typedef enum llm_pie_op {
#define LLM_PIE_OP_ENUM_(id, name) LLM_PIE_OP_##id,
    LLM_PIE_OPS(LLM_PIE_OP_ENUM_)
#undef LLM_PIE_OP_ENUM_
    LLM_PIE_OP_COUNT
} llm_pie_op;

/* Default of the alignment debug check (on in host builds). When on, a
 * 128-bit access whose address has bits 3:0 set (or a 16/32-bit broadcast
 * with its low 1/2 bits set) aborts with a message naming the instruction,
 * because the S3 would silently access the rounded-down address instead.
 * When off, the model does exactly what the S3 does. */
#ifndef LLM_PIE_CHECK_ALIGN
#define LLM_PIE_CHECK_ALIGN 1
#endif

/* The modelled registers of one core. Byte k of a q register is bits
 * 8k+7..8k (little-endian lanes, as on the chip). */
typedef struct llm_pie_state {
    uint8_t q[8][16];
    int64_t accx;           /* 40-bit signed value, kept sign-extended */
    int32_t qacc_l[8];      /* 20-bit signed lanes, kept sign-extended */
    int32_t qacc_h[8];
    uint32_t sar;           /* core SAR, 6 bits */
    uint32_t sar_byte;      /* SAR_BYTE, 4 bits */
    int check_align;        /* see LLM_PIE_CHECK_ALIGN */
    uint64_t counts[LLM_PIE_OP_COUNT];
} llm_pie_state;

/* This thread's modelled core (never NULL). Tests read and write it directly
 * to set up and inspect register contents. */
llm_pie_state *llm_pie_state_get(void);

/* Zero every register of this thread's core and its counters; the alignment
 * check goes back to LLM_PIE_CHECK_ALIGN. */
void llm_pie_state_reset(void);

/* Turn the alignment check of this thread's core on (1) or off (0). */
void llm_pie_check_align_set(int on);

/* Instruction counters of this thread's core: every modelled instruction
 * executed since the last reset, per mnemonic. */
void llm_pie_counts_reset(void);
void llm_pie_counts_get(uint64_t counts[LLM_PIE_OP_COUNT]);
uint64_t llm_pie_counts_total(void);
const char *llm_pie_op_name(llm_pie_op op);

/* ---- instruction models, called only through pie.h macros ---- */
/* Memory ops return the post-incremented address register. */
void *llm_pie_m_vld_128(llm_pie_op op, int qu, const void *as, intptr_t inc);
void *llm_pie_m_vst_128(llm_pie_op op, int qv, void *as, intptr_t inc);
void *llm_pie_m_vldbc(llm_pie_op op, int bits, int qu, const void *as, intptr_t inc);
void llm_pie_m_zero_accx(void);
void llm_pie_m_zero_qacc(void);
void llm_pie_m_zero_q(int qa);
void llm_pie_m_mv_qr(int qu, int qs);
void llm_pie_m_vmulas_accx(llm_pie_op op, int lane_bits, int qx, int qy);
void *llm_pie_m_vmulas_accx_ld(llm_pie_op op, int lane_bits, int qu, const void *as,
                               intptr_t inc, int qx, int qy);
int32_t llm_pie_m_srs_accx(uint32_t as, int sel);
uint32_t llm_pie_m_rur_accx_0(void);
uint32_t llm_pie_m_rur_accx_1(void);
void llm_pie_m_wur_accx_0(uint32_t as);
void llm_pie_m_wur_accx_1(uint32_t as);
uint32_t llm_pie_m_rur_sar_byte(void);
void llm_pie_m_wur_sar_byte(uint32_t as);
uint32_t llm_pie_m_movi_32_a(int qs, int sel);
void llm_pie_m_movi_32_q(int qu, uint32_t as, int sel);
void llm_pie_m_bitwise(llm_pie_op op, int qa, int qx, int qy);
void llm_pie_m_vshift_32(llm_pie_op op, int qa, int qs);
void llm_pie_m_vmul_s8(int qz, int qx, int qy);
void llm_pie_m_vzip_8(llm_pie_op op, int qs0, int qs1);
void llm_pie_m_vcmp_lt_s8(int qa, int qx, int qy);
void llm_pie_m_vadds_s8(int qa, int qx, int qy);
void llm_pie_m_src_q(int qa, int qs0, int qs1);
void llm_pie_m_wsr_sar(uint32_t as);
void llm_pie_m_ssai(int imm);
void llm_pie_m_nop(void);

#endif
