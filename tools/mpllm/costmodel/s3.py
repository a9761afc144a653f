"""What the ESP32-S3 and the firmwares' code cost, as published figures and
source-code counts (never fitted; the fitted constants are calibration's):
the clock, cores, hand-off, data cache and flash; the cycles and op counts
of the scalar routines and libm calls; the certified head's tile constants;
the published rows-scored share of the release head. Each says its source.
"""

from ..formats.head_tiles import TILE_ROWS  # noqa: F401 (one definition, used by the package)

#: CPU clock: 240 MHz (the board's sdkconfig; esp32-ai's sdkconfig.defaults
#: CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_240).
CPU_HZ = 240e6
#: Both LX7 cores compute; MicroPython (or upstream's loop task) runs on one,
#: the worker task on the other (port_esp32.c).
CORES = 2
#: One hand-off of work to the second core and back (task notify round trip):
#: ~34 us, measured on the board by esp32-ai (firmware/esp32_tinystories,
#: CERT_WAVE: "the ~34 us task-notify round trip", swept on the board).
HANDOFF_S = 34e-6
#: Data cache: 32 KB (the board's sdkconfig; esp32-ai sdkconfig.defaults
#: CONFIG_ESP32S3_DATA_CACHE_32KB). A working set that fits is fetched once.
DCACHE_BYTES = 32 * 1024
#: A random 512-byte row from memory-mapped flash costs ~20 us (published esp32-ai measurement),
#: applied as 512 B / 20 us to the bytes of the lines read from flash.
FLASH_ROW_BYTES = 512
FLASH_ROW_S = 20e-6
FLASH_BPS = FLASH_ROW_BYTES / FLASH_ROW_S
#: One PIE instruction issues per cycle (single-issue LX7 pipeline; a PIE MAC
#: is 16 int8 products, pie.h). Internal SRAM reads are inside the
#: instruction counts: no bandwidth term.
PIE_CYCLES = 1.0

# Scalar routines, as op counts (x C_OP) read off the sources, or as cycles
# where the board measured them.
#: Activation quantization, per element, without a libm call: 34 cycles.
#: Derived from two esp32-ai board measurements (runtime/llm.h, QACT notes):
#: 0.61 ms/token over the 18 attention call sites (EXP-129: "~85 cycles per
#: element"), of which lrintf was 51 cycles (EXP-130: prep 0.66 -> 0.29 ms
#: over the same 1,728 elements when lrintf became add-half-and-truncate).
#: Our magic-number round-half-even has the same loop shape: assumed equal.
QUANT_CYCLES = 85.0 - 51.0
#: The libm lrintf call on the S3 toolchain (EXP-130, above).
LRINTF_CYCLES = 51.0
#: newlib expf: "roughly 200 cycles" (esp32-ai runtime/llm.h, llm_fast_expf
#: note). Used by the stock softmax and by every esp32-ai SiLU.
NEWLIB_EXPF_CYCLES = 200.0
#: newlib erff (GELU in every esp32-ai build) is not published; it is
#: derived after the fit from the research branch's "The PLE stage measures
#: 1.5 ms" (runtime/llm.h, FASTACT note, a build without lrintf): what that
#: stage leaves after everything but its 768 erff calls (`Fit.erff_cycles`).
RESEARCH_PLE_MS = 1.5
#: powf/cosf/sinf (stock and esp32-ai compute the RoPE row per token, 12 of
#: each): an assumption of the same order as newlib expf.
NEWLIB_TRIG_CYCLES = 200.0
#: The softmax-weight rounding's lrintf and llm_fast_expf's floorf (libm
#: calls in esp32-ai's int8-KV softmax until its last build): 12 cycles each.
#: From "Two other libm calls (lrintf, twice) were worth 1.4 ms/token"
#: (llm.h, llm_fast_expf note): 1.4 - 1.27 ms for quantize_act's = 0.13 ms
#: over the 2,520 softmax weights of a token; floorf assumed the same.
SOFT_LIBM_CYCLES = (1.4e-3 - 1.27e-3) * CPU_HZ / 2520
#: esp32-ai's softmax pass per (position, head) with llm_fast_expf, the V-scale
#: fold and the weight rounding, both libm calls included: 1.93 ms for the
#: 2,520 pairs of a token ("softmax now the largest single term ... 1.93 ms",
#: llm.h, measured before the pass was split by heads) = 184 cycles.
SOFTMAX_PAIR_CYCLES = 1.93e-3 * CPU_HZ / 2520
#: Ops of that pass per pair that are not one dependent float chain (loads,
#: stores, compares, the rounding's clamps)...
SOFTMAX_PAIR_OPS = 10
#: ... and the chain: llm_fast_expf without its call (mul, cvt, compare,
#: sub, 3-term Horner (6), exponent build (3), mul) plus s - max, * vscale,
#: * 1/wscale, |w|. Dependent float ops wait for the previous result, so
#: they cost more than the fitted average op: the pass above prices them
#: (`Fit.chain_cycles`, derived after the fit).
FAST_EXPF_CHAIN_OPS = 14 + 4
#: llm_expf (native/engine/mathf.c), as chain ops: range reduction (mul, 2
#: add, cvt, 2 mul+2 add), degree-4 Horner (8), final (r*r, mul, 2 add),
#: exponent build and scale (3), 2 tests.
EXPF_OPS = 22
#: llm_erff on |x| < 1 (where GELU inputs mostly fall): degree-7 Horner in
#: x^2 (14), x^2, the final ax + ax*p (2), sign and range tests (5).
ERFF_OPS = 22
#: llm_logf: classify (4), mantissa split (6), s = f/(2+f) (div), Horner (6),
#: the final combination (8).
LOGF_OPS = 24
#: The S3 FPU has no one-step divide or square root: div0.s/divn.s and
#: sqrt0.s/nexp01.s + Newton steps expand to about ten dependent float
#: instructions each (priced as chain ops).
DIV_OPS = 10
SQRT_OPS = 10
#: PCG32 step on a 32-bit core: 64-bit multiply-add (4 mul + carries), the
#: xorshift/rotate, the float conversion of the uniform.
PCG32_OPS = 20
#: fp32 dot product inner loop: load q, load k, mul, add (no FMA:
#: -ffp-contract=off).
FDOT_OPS = 4
#: fp32 axpy inner loop (ao[i] += w*v[i]): load v, load ao, mul, add, store.
FAXPY_OPS = 5
#: A scalar kernel reading int4 weights in place (core "int4-flash": llm.h
#: matvec_q, esp32-ai before it staged weights) unpacks each one in the inner
#: loop: byte load, parity test, shift or mask, -8, int->float, beside the MAC.
Q4_UNPACK_OPS = 4
#: Per output row of a matvec: (float)g, * scale, acc +=, * xscale, store,
#: loop; the PIE kernels add the -8*sum(x) correction.
ROW_OPS_SCALAR = 6
ROW_OPS_PIE = 7
#: esp32-ai's PIE int4 kernels put one asm block per 32-column block inside a
#: C loop: counter and branch around it.
UPSTREAM_BLOCK_OPS = 2
#: esp32-ai's scalar int8 dot (llm_dot_i8, one core, weights resident in
#: PSRAM): 24.8 M MAC/s measured on the board (runtime/llm.h, LLM_SIMD_S8
#: note: "56.8 Mops/s vs 24.8 scalar ... with the weights PSRAM-resident";
#: 32-byte lines assumed, the default then). Pins C_MAC_I8 (see Fit).
SCALAR_DOT_MACS_PER_S = 24.8e6
#: esp32-ai's half2float, normal-number path.
HALF2FLOAT_OPS = 8
#: llm_matvec_q4_cols_pie (kernels_pie.c) keeps a row of up to this many
#: 32-column blocks in q0..q5 and multiplies it with every column; wider or
#: multi-group rows go through the single-vector kernel once per column.
COLS_RESIDENT_BLOCKS = 3

# Certified head: tiles, bounds, order.
#: Rows per tile: the image's head_tiles.TILE_ROWS, imported above (esp32-ai's
#: CERT_TILE is 128 too): 199 tiles for 25,353 rows.

#: Our bound kernel, per tile: two int8 dot products of 96 (xq.mid and
#: |xq|.half) = ~2 x (6 loads + 6 MACs) + zero/read-out. Used when no count
#: was measured; measure_host counts llm_matvec_s8_pie through the host model
#: (29 per tile for 199 tiles of 2 x 96 columns).
BOUND_PIE_PER_TILE = 30
#: ... and per tile the int -> float, two multiplies (tile scale, slack) and
#: the binary-heap insertion.
BOUND_OPS_PER_TILE = 12
#: A heap operation costs ~2*log2(n) compares (sift-down); each compare is a
#: load, compare and move.
HEAP_OPS_PER_CMP = 3
#: Candidate update per scored row: compare with the floor, branch, count.
CAND_OPS_PER_ROW = 3
#: esp32-ai's scalar tile bound (max of two products per dimension): 1.074 ms
#: for 199 tiles x 96 dims (EXP-134, runtime of the build before it moved to
#: PIE) = 13.5 cycles per tile dimension.
UPSTREAM_BOUND_SCALAR_CYCLES_PER_DIM = 1.074e-3 * CPU_HZ / (199 * 96)
#: ... and its PIE bound (two dot chains per tile): 0.099 ms = 119 cycles/tile.
UPSTREAM_BOUND_PIE_CYCLES_PER_TILE = 0.099e-3 * CPU_HZ / 199
#: esp32-ai's qsort of the 199 tile bounds: "~1500 comparisons at ~52 cycles
#: each" (0.330 ms, EXP-134); its radix sort: "~1800 operations".
QSORT_CMP_CYCLES = 52.0
RADIX_OPS_PER_KEY = 9

#: Published rows-scored share of the certified head for greedy on the real
#: release model: 8,427-8,749 of 25,353 rows (esp32-ai board runs, CERT_SEED
#: and action_bench notes). The headline uses 0.34, the range is shown.
RELEASE_GREEDY_FRACTION = 0.34
RELEASE_GREEDY_RANGE = (8427 / 25353, 8749 / 25353)

#: Every constant here is public (the package hands them all on, TILE_ROWS
#: included): the list is computed, not written out a second time.
__all__ = [name for name in globals() if name.isupper()]
