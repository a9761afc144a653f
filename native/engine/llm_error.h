/*
 * Internal: fill an llm_error. Every failure in the engine goes through this
 * so the status and its message are always set together.
 */
#ifndef LLM_ERROR_H
#define LLM_ERROR_H

#include "llm.h"

#if defined(__GNUC__)
#define LLM_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define LLM_PRINTF_LIKE(f, a)
#endif

/* Sets err (if not NULL) and returns status, so callers can `return llm_fail(...)`. */
llm_status llm_fail(llm_error *err, llm_status status, const char *fmt, ...)
    LLM_PRINTF_LIKE(3, 4);

#endif
