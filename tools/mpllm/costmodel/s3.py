"""What the ESP32-S3 and the firmwares' code cost, as published figures and
source-code counts (never fitted; the fitted constants are calibration's):
the clock, cores, hand-off, data cache and flash; the cycles and op counts
of the scalar routines and libm calls; the certified head's tile constants;
the published rows-scored share of the release head. Each says its source.
"""

# TILE_ROWS: one definition, used by the package; the published rows-scored share of
# the release head (greedy) and its range: mpllm.models' (bench.py's command
# line reads them without the cost model)
from ..formats.head_tiles import TILE_ROWS  # noqa: F401
from ..models import RELEASE_GREEDY_FRACTION, RELEASE_GREEDY_RANGE  # noqa: F401

#: CPU clock: 240 MHz (the board's sdkconfig; esp32-ai's sdkconfig.defaults
#: CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_240).
CPU_HZ = 240e6
#: Both LX7 cores compute; MicroPython (or upstream's loop task) runs on one,
#: the worker task on the other (port_esp32.c).
CORES = 2
#: One hand-off of work to the second core and back (task notify round trip):
#: ~34 us, measured on the board by esp32-ai (firmware/esp32_tinystories,
#: CERT_WAVE: "the ~34 us task-notify round trip", swept on the board). It
#: prices esp32-ai's builds, which hand off by task notification.
HANDOFF_S = 34e-6
#: Our port hands off through two FreeRTOS binary semaphores instead
#: (native/port/esp32/port_esp32.c: xSemaphoreGive(go) ... xSemaphoreTake(done),
#: the worker blocking in xSemaphoreTake(go)). FreeRTOS documents unblocking a
#: task by a direct notification as 45 % faster than by a binary semaphore, 35 %
#: with the semaphore implementation of V8.2.0 and later (freertos.org, "RTOS
#: task notifications", performance benefits); the whole round trip is priced
#: at that ratio: 34 us x 1.35. Nothing here has been measured on our port.
HANDOFF_SEMAPHORE_S = HANDOFF_S * 1.35
#: A what-if, not our port: a hand-off that spins on two counters in internal
#: SRAM (no scheduler), estimated at 2 us a round trip. Built and tried: on the
#: emulated N16R8 its firmware faulted on core 0 in the FreeRTOS tick
#: interrupt in 4 of 59 load-decode-soft-reset cycles, against 2 of 229 with
#: the semaphores (the older firmware: 1 of 113; firmware/README.md), so it is
#: not the port until the fault is understood.
HANDOFF_SPIN_S = 2e-6
#: Data cache: 32 KB (the board's sdkconfig; esp32-ai sdkconfig.defaults
#: CONFIG_ESP32S3_DATA_CACHE_32KB). A working set that fits is fetched once.
DCACHE_BYTES = 32 * 1024
#: Published PSRAM bus rates through the data cache, the line fills every
#: build is priced at (pinned, never fitted; the dense heads they were measured
#: beside are held-out anchors). 64-byte lines: 85.3 MiB/s, i.e. 0.716 us a
#: line (slvDev/esp32-ai 9965f5ec, firmware/esp32_tinystories/action_bench.h:
#: the head's scan "running at 84 MiB/s against an 85.3 MiB/s bus"). 32-byte
#: lines: the 60.7 ceiling that cached scalar loads, cached vector loads and
#: memcpy all reached within 2 % (9965f5ec idf_tinystories/sweep/line64.conf,
#: "cycle 09b"; written "MB/s" there but the same note's head ran at 60.6 MiB/s
#: at that ceiling, so MiB/s).
PSRAM_BUS_LINE64_BPS = 85.3 * 2**20
PSRAM_BUS_LINE32_BPS = 60.7 * 2**20
S_LINE64 = 64 / PSRAM_BUS_LINE64_BPS
S_LINE32 = 32 / PSRAM_BUS_LINE32_BPS

#: Instruction cache. Code in flash runs through it; code in internal
#: instruction RAM (IRAM) does not. Our board's sdkconfig.board sets only the
#: data cache, and neither MicroPython's sdkconfig.base nor its 240 MHz /
#: octal-PSRAM fragments set the instruction cache, so it is ESP-IDF's default
#: for the ESP32-S3: 16 KB (CONFIG_ESP32S3_INSTRUCTION_CACHE_16KB) with 32-byte
#: lines. Both cores share it. esp32-ai's measured builds set 32 KB (9965f5ec
#: idf_tinystories/sdkconfig.defaults CONFIG_ESP32S3_INSTRUCTION_CACHE_32KB).
ICACHE_BYTES_OURS = 16 * 1024
ICACHE_BYTES_UPSTREAM = 32 * 1024
#: The board without PSRAM (firmware/boards/MPLLM_N8/sdkconfig.board) keeps
#: the same 16 KB: with the engine's token code in IRAM the rest fits.
ICACHE_BYTES_N8 = 16 * 1024
ICACHE_LINE = 32
#: One instruction-cache line from flash (QIO, 80 MHz; the board's
#: sdkconfig.board): a quad I/O read (EBh) is 8 instruction clocks, 6 address
#: clocks (24 bits over 4 lines), 2 mode and 4 dummy clocks, then 2 clocks a
#: byte: 84 clocks for 32 bytes = 1.05 us, bus arbitration not counted.
ICACHE_MISS_S = (8 + 6 + 2 + 4 + 2 * ICACHE_LINE) / 80e6
#: Code one generated token runs, in bytes: x86-64 gcc -O2 sizes taken as
#: the Xtensa sizes (an assumption; the LX7's 16/24-bit encodings are, if
#: anything, denser). The engine: the functions marked LLM_HOT
#: (native/engine/hot.h), measured by code_size.measure_engine_code_bytes
#: (held equal by a test: engine.c 13,343, head.c 3,309, mathf.c 1,631,
#: sampler.c 883, llm_quantize_act 283, the q4 and s8 kernels 801 (the
#: reference kernels standing for the PIE ones)): 20,250 (K cached as dots,
#: RoPE re-applied on read, added 1,280 to engine.c). The esp32 build
#: places them in IRAM (LLM_HOT_SECTION), so none of it goes through the
#: instruction cache. MicroPython's VM on the loop's path (py/*.o of the unix
#: port built with _llm: mp_execute_bytecode 7,189, mp_binary_op 1,145,
#: mp_map_lookup 821, gc_alloc 728, generator resume, calls, attribute,
#: subscript, list and dict helpers): 13,897, of which the esp32 port puts
#: the first three in IRAM itself (ports/esp32/mpconfigport.h,
#: MICROPY_WRAP_MP_EXECUTE_BYTECODE / _BINARY_OP / _MAP_LOOKUP = IRAM_ATTR):
#: 9,155. FreeRTOS's semaphore give/take, the scheduler's switch and the
#: cross-core yield: 4,096, an estimate (not measured); in flash on our boards
#: (firmware/boards/sdkconfig.mpllm: CONFIG_FREERTOS_PLACE_FUNCTIONS_INTO_FLASH
#: moves the functions no ISR calls). The binding's step/verify glue: 1,024,
#: an estimate.
CODE_BYTES_ENGINE = 20250
CODE_BYTES_MICROPYTHON = 13897
CODE_BYTES_MICROPYTHON_IRAM = 7189 + 1145 + 821
CODE_BYTES_FREERTOS = 4096
CODE_BYTES_BINDING = 1024
#: An int8 or fp32 image's token also runs code that is not LLM_HOT (an int4
#: image never does, so IRAM holds only the int4 path): the format's dispatch,
#: dense head, kernel and (int8) the input's quantization in groups, measured
#: by code_size.measure_format_code_bytes (held equal by a test); on the board
#: it runs from flash through the instruction cache.
CODE_BYTES_FORMATS = {"int4": 0, "int8": 2772, "fp32": 2574}

#: llm.py's per-token loop around the engine (Session.run's loop: a token's
#: remembered text, or the tokenizer's bytes through the UTF-8 decoder the
#: first time; the counters; verify_pass for verify passes), counted on the
#: MicroPython v1.28 unix port built with our module (kept unstripped) by
#: `python -m mpllm.costmodel.python_loop --count --micropython PATH
#: --micropy-dir DIR`: the demo model, llm.generate at T 0.8 top-40, seeds
#: 1,2,3, stories of at most 160 tokens minus stories of at most 40 (283
#: story tokens). Per story token: (the host instructions outside
#: native/engine/, i.e. MicroPython's runtime, the libc under it, our binding
#: and port layer; their misses in a simulated 32 KB, 8-way, 64-byte-line
#: data cache, the board's DCache, through which the engine's token streams
#: more than 32 KB in between, as on the board). "token" and "pass" are solved from a
#: drafter that never guesses and the n-gram drafter, as the timed loop was.
#: The stories' text goes to a list (story() writes it to the serial port
#: instead: that is not charged, as it was not when the loop was timed).
PY_LOOP_COUNTS = {
    "step": (16619, 200.9),
    "token": (25726, 24.9),
    "pass": (13833, 269.5),
}
#: MicroPython's own pystone (tests/perf_bench misc_pystone.py) counted the
#: same way on the same binary: host instructions of one pystone loop.
PY_PYSTONE_IR = 41271
#: MicroPython on an ESP32 runs pystone 1.2 (pystone_lowmem, 500 passes) at
#: 1,075 pystones/s (micropython-ulab issue #296, the ESP32 port at its
#: default 240 MHz; micropython issue #5673 reports 1,661 and 499 at 240 MHz
#: for two other builds). So a counted host instruction of the loop costs
#: the board 1 / (PY_PYSTONE_IR x PY_PYSTONES_S3) s, and each of its
#: data-cache misses a 64-byte PSRAM line fill (the GC heap and the loop's
#: objects are in PSRAM on the N16R8; the misses on stack and static data,
#: internal SRAM on the board, are charged too, and the same price is kept
#: for the N8, whose heap is internal: both are upper bounds). The loop's
#: code is not charged misses: MicroPython puts its VM, binary ops and map
#: lookups in IRAM and the rest fits the instruction cache (CODE_BYTES_*
#: above), whereas on the host the engine's own code evicts it every token.
PY_PYSTONES_S3 = 1075.0
#: The same loop timed by the host's clock (the loop's wall time minus the
#: engine's total_ms, each story's least of 12 rounds: 3.66 us a story token
#: step by step) and scaled by the pystones of the same binary (276,985/s)
#: gives 1.8 times the counted figure (other machines' clocks gave 0.8 to
#: 1.7 times): between two tokens the engine has evicted the loop's code and
#: data from the host's caches, which the counts charge only for data (the
#: board keeps the code). `bench.py --model-s3` prints it beside the counted
#: figure.
PY_LOOP_WALL_STEP_S = 3.66e-6 * 276985.0 / PY_PYSTONES_S3


def python_loop_s_from_counts(ir: float, misses: float, pystone_ir: float = PY_PYSTONE_IR
                              ) -> float:
    """S3 seconds of `ir` counted loop instructions and `misses` data-cache
    misses (see PY_LOOP_COUNTS)."""
    return ir / (pystone_ir * PY_PYSTONES_S3) + misses * S_LINE64


def python_loop_s(kind: str) -> float:
    """llm.py's loop on the S3, seconds: per story token step by step
    ("step"), or with verify passes per story token ("token") and per pass
    ("pass")."""
    return python_loop_s_from_counts(*PY_LOOP_COUNTS[kind])


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
#: The same over four rows for one position (engine.c scores_rows4): q[i]
#: loaded once for the four sums.
FDOT_ROWS4_OPS = 3 + 1 / 4
#: fp32 axpy inner loop (ao[i] += w*v[i]): load v, load ao, mul, add, store.
FAXPY_OPS = 5
#: The same for one position over four V rows held as int16 dots (engine.c
#: values_rows4), per element and row: the int16 load and convert, * scale,
#: * xscale, * w, + (6); ao's load and store once per four rows (0.5) and the
#: scale's load once per four rows (0.25). Row at a time it is FAXPY_OPS
#: plus the recompute's 4 (load, convert, two multiplies), with v stored.
V_ROWS4_OPS = 6 + 2 / 4 + 1 / 4
#: A cached k rebuilt from its int16 dots with RoPE re-applied (engine.c
#: cached_k), per element, once per cached row and kv head for all the
#: query heads and positions that read it: the int16 load and convert, the
#: scale's load, * scale, + to 0, * xscale (6); per pair of elements the
#: cos and sin loads, four multiplies, the add and the subtract and two
#: stores (10: 5 an element).
K_REBUILD_OPS = 6 + 5
#: Storing a K row as int16 dots instead of copying floats (engine.c
#: store_kv), per element: the two range compares and their and, the
#: convert (4 on top of the copy's load and store).
K_DOTS_STORE_OPS = 4
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
#: Our int8-in-groups matvec (llm_matvec_q8_pie, kernels_pie.c; Q8_0 as
#: llama2.c's runq.c) besides its PIE instructions (pie.pie_q8_matvec_instructions),
#: read off the source: per group the group sum's int -> float, the scale's and
#: the input scale's loads, the two multiplies and the add to the row's sum (6);
#: per row the row pointers, the sum zeroed, the store and the loop (4).
Q8_GROUP_OPS = 6
Q8_ROW_OPS = 4
#: Its input (llm_quantize_act_groups: quantize_span, the loop llm_quantize_act
#: runs, on each group alone) costs QUANT_CYCLES an element as int4's does, and
#: per group the two divides of its scale (127 / xmax, xmax / 127), as chains.
Q8_QUANT_GROUP_CHAIN = 2 * DIV_OPS
#: Our fp32 matvec (llm_matvec_f32_pie, kernels_pie.c: the S3 has no float SIMD,
#: so this is the scalar FPU, eight named accumulators), read off the source as
#: the instructions the in-order LX7 issues. Per weight: the weight's load, the
#: input's load, mul.s and add.s: FDOT_OPS, the mix of the stock build's
#: attention dot products that C_OP is fitted on (no fused multiply-add:
#: -ffp-contract=off). The eight lanes are independent, so no add waits on the
#: one before it (no chain) ...
F32_WEIGHT_OPS = FDOT_OPS
#: ... per step of eight columns the index add and the loop's branch (the
#: eight loads take immediate offsets) ...
F32_STEP_OPS = 2
#: ... and per row the eight lanes zeroed, the row pointer, the seven tail
#: tests, the seven adds of the fixed reduction, the store and the loop.
F32_ROW_OPS = 8 + 1 + 7 + 7 + 1 + 1
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
#: The certified head's staged rows keep their one scale as fp16 (2 bytes,
#: engine_open.c); each scored tile widens its rows' scales to f32 before the
#: kernel call (head.c staged_rows). Counted from xtensa-esp32s3-elf-gcc
#: -O2's code of the branch-free loop every tile of positive normal scales
#: takes (a trained head's): per row the 16-bit load, shift, rebias add,
#: store, the range test's subtract and maxu, and the two pointer steps (a
#: zero-overhead `loop`) ...
HEAD_SCALE_WIDEN_ROW_OPS = 8
#: ... and per kernel call (one a tile of 128 rows) the view, the loop's
#: setup (constants, trip count, pointers) and the test after it.
HEAD_SCALE_WIDEN_CALL_OPS = 14
#: Token ids the certified head reads per evaluation: only rows that could
#: enter the candidate list read theirs (head.c). Measured by the host engine
#: (stats()["head_ids"] / heads) on a random release-shaped head, 20 prompts x
#: 41 steps: greedy 8.9, T 0.8 top-40 342.4. Each read is charged a whole PSRAM
#: line (an upper bound: a numpy replay of the same scans touched 0.63 lines a
#: read greedy and 0.31 at top-40), never more lines than the rows' ids fill.
HEAD_ID_READS = {"greedy": 8.9, "top40": 342.4}
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


#: Every constant here is public (the package hands them all on, TILE_ROWS
#: included): the list is computed, not written out a second time; and the
#: loop's price.
__all__ = [name for name in globals() if name.isupper()] + ["python_loop_s",
                                                            "python_loop_s_from_counts"]
