/*
 * What differs between the two MicroPython builds of `_llm`, behind one small
 * interface so that the binding's files are the same on both:
 *   - ESP32-S3 firmware (Xtensa): the image is the `model` flash
 *     partition mapped through the cache (native/port/esp32), placement with
 *     heap_caps, a second core for half of each large matvec;
 *   - unix port (everything else): the image is a file mapped read-only
 *     (native/port/host), malloc placement. Used to test the binding itself.
 */
#ifndef MPLLM_MODLLM_PLATFORM_H
#define MPLLM_MODLLM_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "llm.h"

/* Keyed on the compiler, not on ESP_PLATFORM: MicroPython's QSTR scan
 * preprocesses modllm.c with the Xtensa compiler but without ESP-IDF's
 * definitions (or ours from micropython.cmake). */
#if defined(__XTENSA__)

#include "port_esp32.h"

typedef llm_esp32_port mpllm_port_t;
typedef llm_esp32_map mpllm_map_t;

/* Model() with no argument opens the partition of this label. */
#define MPLLM_DEFAULT_SOURCE LLM_ESP32_MODEL_LABEL
#define MPLLM_SOURCE_KIND "partition"

static inline llm_status mpllm_port_init(mpllm_port_t *p, llm_error *err) {
    return llm_port_esp32_init(p, err);
}
static inline void mpllm_port_deinit(mpllm_port_t *p) { llm_port_esp32_deinit(p); }
static inline llm_port *mpllm_port_get(mpllm_port_t *p) { return &p->port; }
static inline llm_status mpllm_map(const char *source, mpllm_map_t *m, int *sys_errno,
                                   llm_error *err) {
    *sys_errno = 0;
    return llm_esp32_map_partition(source, m, err);
}
static inline void mpllm_unmap(mpllm_map_t *m) { llm_esp32_unmap(m); }
static inline const uint8_t *mpllm_map_data(const mpllm_map_t *m) { return m->data; }
static inline size_t mpllm_map_len(const mpllm_map_t *m) { return m->len; }

/* Ctrl-C on the board sets MicroPython's pending exception (the engine's
 * poll sees it); nothing jumps out of C code, so nothing to hold back. */
static inline int mpllm_interrupts_hold(void) { return 0; }
static inline void mpllm_interrupts_allow(int held) { (void)held; }
static inline int mpllm_interrupt_pending(void) { return 0; }
static inline void mpllm_test_point(const char *name) { (void)name; }

#else

#include "port_host.h"

typedef llm_host_port mpllm_port_t;
typedef llm_host_map mpllm_map_t;

/* No image is built into a unix build, so no MPLLM_DEFAULT_SOURCE: Model()
 * needs a path or a buffer. */
#define MPLLM_SOURCE_KIND "file"

static inline llm_status mpllm_port_init(mpllm_port_t *p, llm_error *err) {
    (void)err;
    llm_port_host_init(p);
    return LLM_OK;
}
static inline void mpllm_port_deinit(mpllm_port_t *p) { (void)p; }
static inline llm_port *mpllm_port_get(mpllm_port_t *p) { return &p->port; }
static inline llm_status mpllm_map(const char *source, mpllm_map_t *m, int *sys_errno,
                                   llm_error *err) {
    return llm_host_map_file(source, m, sys_errno, err);
}
static inline void mpllm_unmap(mpllm_map_t *m) { llm_host_unmap(m); }
static inline const uint8_t *mpllm_map_data(const mpllm_map_t *m) { return m->data; }
static inline size_t mpllm_map_len(const mpllm_map_t *m) { return m->len; }

/* The unix port's default build raises KeyboardInterrupt from its SIGINT
 * handler (MICROPY_ASYNC_KBD_INTR): a longjmp out of whatever C code runs,
 * which could leave the engine half-way through a call, or lose what a
 * finished call made (an engine not yet stored, a token not yet returned).
 * So SIGINT is blocked around engine calls; one that arrives meanwhile stays
 * pending (the prefill's poll sees it), and is then taken off and turned into
 * MicroPython's pending KeyboardInterrupt, raised by the VM once the call has
 * returned (or at once by the binding, when the prefill stopped for it). */
#include <signal.h>

static inline int mpllm_interrupt_pending(void) {
    sigset_t set;
    return sigpending(&set) == 0 && sigismember(&set, SIGINT) == 1;
}
/* hold() returns whether SIGINT was blocked already (the program blocks it
 * itself): allow() is handed that back and then leaves the signal alone. */
static inline int mpllm_interrupts_hold(void) {
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, &old);
    return sigismember(&old, SIGINT) == 1;
}
static inline void mpllm_interrupts_allow(int was_blocked) {
    if (was_blocked) {
        return; /* not ours to take or unblock */
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    if (mpllm_interrupt_pending()) {
        int sig;
        sigwait(&set, &sig);
        mp_sched_keyboard_interrupt();
    }
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

/* A test build's forced Ctrl-C (the unix port built with MPLLM_TEST_HOOKS=1,
 * as tests/test_micropython_binding.py builds it): SIGINT raised at the named
 * point of the binding when the comma-separated MPLLM_TEST_SIGINT lists it,
 * so a test hits a window one syscall wide every time instead of by luck. */
#ifdef MPLLM_TEST_HOOKS
#include <stdlib.h>
#include <string.h>
static inline void mpllm_test_point(const char *name) {
    const char *want = getenv("MPLLM_TEST_SIGINT");
    const size_t n = strlen(name);
    for (const char *p = want; p != NULL && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0)) {
            raise(SIGINT);
        }
    }
}
#else
static inline void mpllm_test_point(const char *name) { (void)name; }
#endif

#endif

#endif
