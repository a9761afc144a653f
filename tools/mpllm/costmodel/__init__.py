"""Cost model: modeled ms/token per stage on the ESP32-S3 N16R8, with a band.

There is no board here, so speed is modeled from what a token costs:

    time(stage) = PSRAM line fills x seconds per fill (32- or 64-byte lines)
                + flash bytes / flash bandwidth
                + (cycles on one core + cycles split over both cores / 2) / 240 MHz
                - the memory of split work hidden behind the other core's compute
                + hand-offs to the second core (esp32-ai: task notify, 34 us;
                  ours: two binary semaphores, 45.9 us)
    and, for our builds on MicroPython, two stages the engine's timers do not
    see: "python" (llm.py's loop per token, measured on the unix port and
    scaled by pystones) and "icache" (the code a token runs, larger than the
    board's 16 KB instruction cache, refetched from flash every token).

  * Memory is counted in cache lines, not bytes: every PSRAM read goes
    through the 32 KB data cache, so a stream costs the lines it touches
    (`lines_touched`). A 96-byte head slice of a 384-byte KV row costs two
    64-byte lines, a whole row six; that is how cache-line overfetch enters,
    and why walking the KV cache head by head costs 8-10 lines a row. A line
    fill costs what the published bus rates say (pinned, not fitted).
  * The LX7 is in order: a miss stalls its core until the line arrives, so
    on one core memory and compute add. Two cores streaming from one bus can
    hide one core's fills behind the other's compute: a split stage ideally
    takes max(M, (M + C)/2) for M bus seconds and C compute seconds; the
    fitted `overlap` is the share of that ideal reached.
  * Compute: PIE instructions (1 cycle each; ours counted by the exact host
    model of the vector unit, `measure_pie_counts`), scalar int8 MACs, scalar
    ops, dependent float chains (exp/erf/log polynomials, divide, square
    root: each op waits for the previous one) and the board-measured cost of
    libm calls (lrintf, newlib expf/erff), each priced by its own constant.
  * Our build's bytes come from the engine's own counters
    (`_llm.Model.stats()`), checked byte for byte against the formulas here
    (`check_bytes`) and then used as a scale on the formulas' line counts.
    Where the core sits is the emulated board's measured placement
    (sram.MEASURED_PLACEMENT: 176,600 B of core in PSRAM), not the plan. The
    share of head rows the certified head scores is an input
    (`HeadFractions`): the real release head is not available here.
  * Every other build is somebody else's firmware (slvDev/esp32-ai at
    9965f5ec), predicted from its own configuration (`BUILDS`: weight formats,
    placement, cache line, kernels, splits, libm calls), each assumption
    stated beside it.
  * Every figure has a band (bands: low / mid / high) from its three dominant
    unknowns: the head rows on the real head, the fill vs overlap split, and
    how much of the core fits internal SRAM.

Speculative decoding (`pass_work`; builds mpllm-spec-greedy/-sampled): a
verify pass of m <= 8 positions (llm_verify) reads every weight once (what
that saves in SRAM is PIE work: llm_matvec_q4_cols's count per row per
column, `measure_cols_pie`; the core in PSRAM streams once per pass), the KV
cache once per layer, and each head tile once for all m
(llm_head_certify_many); everything else runs m times. ms/token = (time of
one pass) / (story tokens per pass) + llm.py's loop per story token, passes
starting at positions 4..203. Tokens per pass and m = drafted + 1 are inputs
(`measure_drafting` on the demo model by default), and so is how many tiles
the positions of a pass have in common (`measure_union`). Positions
1..m-1's buffers and the scan's scratch live in PSRAM and are charged in
cache lines, though the engine's byte counters (checked per pass,
`pass_region_bytes`) do not see them (`_batch_buffers`).

Calibration (`fit`): the 64- and 32-byte line fills are pinned to the
published bus rates (85.3 and 60.7 MiB/s, `PINNED_CONSTANTS`). Three
constants are solved jointly and exactly from three stages of esp32-ai's
stock build, which no other build shares (`FITTED_CONSTANTS`, each anchor's
`fitted_on`):
  C_OP          cycles per scalar op                 <- stock attention (20 ms)
  overlap       two-core memory/compute overlap      <- stock head (59 ms)
  erff          newlib erff's cycles                  <- stock PLE (6.4 ms)
Two more follow from those and a published sub-stage measurement that is
not an anchor (`DERIVED_CONSTANTS`): C_MAC_I8 (scalar int8 dot at 24.8 M
MAC/s) and the cost of a dependent float op (the 1.93 ms softmax pass).
Every other anchor is held out, and the report checks from the work itself
that none of them contains a fitted stage (`anchor_reuse`; the stock total,
which does, is listed as such, not as a prediction); each held-out anchor is
held to ANCHOR_TOLERANCE. The remaining constants are published figures,
counts read off source code or measurements made here, each with its source.

The package, one idea a module (each imports only modules listed above it):

  s3            the S3's published figures, source-code counts and what was
                measured here (never fitted)
  shape         `Shape`/`RELEASE`, the engine's stages, batch limits and regions,
                the matrices of a token, row and cache-line geometry
  pie           PIE instruction counts in closed form
  pie_counter   PIE counts from the host model of the vector unit (compiles
                count_driver.c, kept beside it, and tests/c/pie_kernels_test.c)
  code_size     the engine code a token runs, measured with the host compiler
  sram          the internal SRAM plan (`sram_plan`) and the measured placement
  builds        the firmware configurations (`BUILDS`) and their assumptions
  spec_inputs   `DraftFigures`, `UnionRatios`, `SpecInputs` and their defaults
  work          `Work`, `HeadCounts`, `Fit`; a stage's seconds (`stage_breakdown`)
  forward       one token's work per stage (`token_work`, `build_work`, `predict`)
  passes        one verify pass's work (`pass_work`, `PassHead`, `Passes`)
  calibration   the anchors (`ANCHORS`) and the fit (`fit`)
  prices        `draft_prices`: what a draft position costs
  engine_bytes  the engine's byte accounting, checked against its counters
  bands         a figure's low / mid / high from its three dominant unknowns
  host          measuring the host engine (`measure_host`, `measure_fractions`)
  spec_measure  measuring the speculative inputs (`measure_spec`; uses drafting)
  drafting_study  each drafter's tokens per pass on a model, every pass priced
                (`study`, `measure`; the command `python -m
                mpllm.costmodel.drafting_study`)
  spec_report   the report's speculative builds and their what-ifs
  reporting     `report`, `Report` (table and JSON), the what-ifs, `plot`
  plans         the engine's own plan (`_llm.plan`) of a shape priced without
                weights: a seeded random image of it, cached (`shape_image`)
  llama         llama2.c's shapes on the N16R8 and the N8 (no PSRAM): placement
                (the engine's plan, through plans) and bands (`shape_report`, `bench.py --model-s3 --shape NAME`),
                at each weight format convert.py measures (`CONVERT_FORMATS`),
                its choice first
  ab            a board's `bench.py --ab` report: the overlap fitted from its
                stage times (`overlap_from_stages`; `ab_overlap`, what --ab
                reports), read back and the model refitted
                (`refit`, `bench.py --model-s3 --refit AB.json`)

The int8 and fp32 images (convert.py --weights) are priced the same way as
int4, from their own kernels: int8 (llm_matvec_q8_pie, Q8_0 groups) by its
PIE count (`pie_q8_matvec_instructions`, equal to the host model's count,
`measure_q8_pie_counts`) at PIE_CYCLES, its float steps per group and its
input quantized in groups at QUANT_CYCLES an element (the board-measured
esp32-ai quantize loop, as int4's); fp32 (llm_matvec_f32_pie, the scalar
FPU) by its instructions read off the source (s3.F32_*: per weight FDOT_OPS,
the mix of the stock attention's dot products that C_OP is fitted on). Both
read their own bytes where the placement put them (PSRAM lines at the pinned
bus rate, flash at FLASH_BPS) and run their code from flash through the
instruction cache (`CODE_BYTES_FORMATS`, measured). Their band adds the
scalar op price: C_OP (mid), one op a cycle (low), the same distance above mid (high).

drafting_study is the drafting study's command (`python -m
mpllm.costmodel.drafting_study`): it imports drafting and convert, and is
not handed on here. This module only hands the names on.
"""

# Each module's __all__ lists the names it defines, once; the star imports
# hand them all on.

from .ab import *
from .bands import *
from .builds import *
from .calibration import *
from .code_size import *
from .engine_bytes import *
from .forward import *
from .host import *
from .llama import *
from .passes import *
from .pie import *
from .pie_counter import *
from .prices import *
from .reporting import *
from .s3 import *
from .shape import *
from .spec_inputs import *
from .spec_measure import *
from .spec_report import *
from .sram import *
from .work import *

__all__ = [
    "AB_BUILDS",
    "AB_KEYS",
    "AB_SWITCH_KEYS",
    "ANCHORS",
    "ANCHOR_TOLERANCE",
    "BAND_UNKNOWNS",
    "BUILDS",
    "EXACT_TARGETS_MS",
    "MEASURED_PLACEMENT",
    "MODEL_STAGES",
    "OURS",
    "RELEASE",
    "SPEC",
    "SPEC_TARGET_MS",
    "STAGES",
    "UPSTREAM",
    "Anchor",
    "Build",
    "DraftFigures",
    "Fit",
    "HeadCounts",
    "HeadFractions",
    "Measured",
    "PassHead",
    "Passes",
    "Report",
    "Shape",
    "SpecInputs",
    "UnionRatios",
    "ab_overlap",
    "anchor_reuse",
    "band",
    "build_work",
    "check_bytes",
    "engine_stage_bytes",
    "fit",
    "head_eval_bytes",
    "lines_touched",
    "matrices",
    "measure_adaptive",
    "measure_cols_pie",
    "measure_drafting",
    "measure_fractions",
    "measure_head_fraction",
    "measure_host",
    "measure_pie_counts",
    "measure_q8_pie_counts",
    "measure_spec",
    "measure_union",
    "overlap_from_stages",
    "pass_build_work",
    "pass_region_bytes",
    "pass_work",
    "pie_cols_instructions",
    "pie_matvec_instructions",
    "pie_q8_matvec_instructions",
    "plot",
    "predict",
    "python_loop_s",
    "refit",
    "refit_summary",
    "report",
    "run_region_bytes",
    "spec_entry",
    "sram_plan",
    "stage_seconds",
    "story_positions",
    "upstream_pie_instructions",
]
