/*
 * Names for regions and stages, shared by both bindings so that the CPython
 * and MicroPython `_llm` report the same strings.
 */
#ifndef LLM_NAMES_H
#define LLM_NAMES_H

#include "llm.h"

/* "flash", "fast", "bulk" */
const char *llm_region_name(llm_region region);
/* "embed", "attn", "ffn", "ple", "head", "sample" */
const char *llm_stage_name(llm_stage stage);

#endif
