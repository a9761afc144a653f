/*
 * LLM_HOT marks the functions one generated token runs: the forward pass and
 * attention, the certified head and its waves, the kernels, exp/erf/log and
 * the candidate sampler. A port may give them a section where code runs
 * without instruction-cache misses: the esp32 build defines LLM_HOT_SECTION
 * as ".iram1.llm", which ESP-IDF's linker script places in internal
 * instruction RAM, so a token's engine code never waits on flash through the
 * 16 KB instruction cache (what that saves, and what the bytes cost in SRAM:
 * tools/mpllm/costmodel/s3.py). Every other build leaves it empty.
 *
 * tools/mpllm/costmodel/code_size.py reads these markers to measure the code
 * a token runs; a static function that the compiler inlines needs none.
 */
#ifndef LLM_HOT_H
#define LLM_HOT_H

#if defined(LLM_HOT_SECTION)
#define LLM_HOT __attribute__((section(LLM_HOT_SECTION)))
#else
#define LLM_HOT
#endif

#endif
