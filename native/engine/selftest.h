/*
 * Kernel self-test for the board (firmware, PlatformIO tests) and the host.
 *
 * Runs every PIE kernel against its scalar reference on fixed seeds and
 * prints PASS/FAIL per kernel, then prints what the chip does on the points
 * pie_model.h lists as unverified on silicon (rur.accx_1 upper bits, srs.accx
 * saturation and rounding, vmul.s8 truncation, the ACCX and vadds.s8 rails)
 * next to what the host model predicts, and a few float probes (add, mul,
 * div, sqrt, subnormals included) as hex next to the IEEE-754 result, so the
 * first real board confirms host == board bits.
 *
 * On the host it runs through the PIE model (pie_model.c). Uses about 4 KB of
 * stack and no heap.
 *
 * Line formats (one line per call of `print`, no trailing newline):
 *   "selftest kernels=<pie-native|pie-emu>"
 *   "PASS <kernel> <case>"  /  "FAIL <kernel> <case>"
 *   "PROBE <name> got=0x%08x model=0x%08x SAME|DIFFERS"
 *   "FLOAT <op> a=0x%08x b=0x%08x got=0x%08x expect=0x%08x SAME|DIFFERS"
 *   "selftest failures=<n> probe_differences=<m>"
 */
#ifndef LLM_SELFTEST_H
#define LLM_SELFTEST_H

typedef void (*llm_selftest_print_fn)(void *user, const char *line);

/* Returns the number of failures: kernel mismatches plus float probes that
 * differ from IEEE-754 (either breaks the bit-exact contract). A PIE probe
 * that differs from the model is reported (probe_differences) but not
 * counted: it means the host model must be corrected, which the kernel
 * results then show whether it matters. */
int llm_selftest_run(llm_selftest_print_fn print, void *user);

#endif
