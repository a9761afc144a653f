/*
 * Host port: malloc-based placement with per-region accounting, a monotonic
 * clock, and a read-only file mapper. POSIX (Linux, macOS); used by the
 * CPython `_llm`, the C tests and the fuzzer.
 *
 * The host has one kind of memory, so "placing" only records what the engine
 * asked for. Optional per-region capacities let tests play a small board:
 * a FAST request over capacity lands in BULK (reported through *placed),
 * a BULK request over capacity fails.
 */
#ifndef LLM_PORT_HOST_H
#define LLM_PORT_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "llm.h"

typedef struct llm_host_port {
    llm_port port;                        /* hand &this->port to llm_open */
    uint64_t capacity[LLM_REGION_COUNT];  /* 0 = unlimited */
    uint64_t in_use[LLM_REGION_COUNT];    /* bytes live now */
    uint64_t peak[LLM_REGION_COUNT];
    uint64_t asked[LLM_REGION_COUNT];     /* bytes requested per wanted region */
    uint32_t live_blocks;
    /* The cache preload hook (llm_port.preload): the host has no cache to
     * stage, so it only counts what it was asked (the tests' witness that
     * the engine calls it when llm_set_preload is on, and never when off). */
    uint64_t preloads, preload_bytes;
} llm_host_port;

/* Ready-to-use port, unlimited capacities. */
void llm_port_host_init(llm_host_port *hp);

/* A read-only mapping of a whole file. */
typedef struct llm_host_map {
    const uint8_t *data;
    size_t len;
} llm_host_map;

/* Map `path` read-only. On failure returns LLM_E_ARG with a message naming
 * the file and the reason (missing, unreadable, a directory, empty) and, if
 * sys_errno is not NULL, the errno behind it (0 when there is none). */
llm_status llm_host_map_file(const char *path, llm_host_map *map, int *sys_errno,
                             llm_error *err);
void llm_host_unmap(llm_host_map *map);

#endif
