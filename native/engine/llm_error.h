/*
 * Internal: fill an llm_error. Every failure in the engine goes through this
 * so the status and its message are always set together.
 */
#ifndef LLM_ERROR_H
#define LLM_ERROR_H

#include <stdarg.h>
#include <stdio.h>

#include "llm.h"

#if defined(__GNUC__)
#define LLM_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define LLM_PRINTF_LIKE(f, a)
#endif

/* Sets err (if not NULL) and returns status, so callers can `return llm_fail(...)`.
 * Defined here (static inline) so the sampler and the ports, which are also
 * built without engine.c, share the one definition. */
static inline llm_status llm_fail(llm_error *err, llm_status status, const char *fmt, ...)
    LLM_PRINTF_LIKE(3, 4);
static inline llm_status llm_fail(llm_error *err, llm_status status, const char *fmt, ...) {
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

#endif
