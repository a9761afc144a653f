/*
 * ESP32-S3 port layer (ESP-IDF v5.5): where the engine's memory comes from,
 * how the model partition is read, how time is taken, and the second core.
 *
 * Placement (firmware/README.md). The engine asks for a region per buffer; this port
 * decides:
 *   FLASH  never allocated: embedding and PLE rows are read in place from the
 *          memory-mapped `model` partition (llm_esp32_map_partition).
 *   FAST   internal SRAM (MALLOC_CAP_INTERNAL), as long as at least
 *          `fast_reserve` bytes of internal SRAM stay free afterwards for
 *          ESP-IDF, Wi-Fi and the MicroPython task; otherwise the buffer goes
 *          to PSRAM and the engine is told so (*placed = BULK), which is what
 *          Model.memory() then reports.
 *   BULK   PSRAM (MALLOC_CAP_SPIRAM). No fallback to internal SRAM: that
 *          would starve the buffers that need it. On a board without PSRAM
 *          (has_psram == 0) there is nowhere else: BULK buffers go to internal
 *          SRAM under the same reserve, and a model too large for that fails
 *          to open (LLM_E_NOMEM) instead of starving ESP-IDF or MicroPython.
 * Every block carries a 16-byte prefix (size, region) so frees keep the
 * per-region books in `in_use`/`peak` without a table (../port_blocks.h).
 *
 * Two cores. MicroPython runs on core 1. llm_port_esp32_init starts a worker
 * task pinned to core 0; llm_esp32_parallel_rows hands it the upper half of a
 * row range and runs the lower half on the calling task, then waits. Each row
 * is computed by the same kernel call as in a single-core run and no float
 * reduction crosses rows, so the results are bit-identical. PIE instructions
 * are executed only by these two tasks (the caller and the worker), both
 * pinned, and a kernel never blocks mid-way (pie.h).
 */
#ifndef LLM_PORT_ESP32_H
#define LLM_PORT_ESP32_H

#include <stddef.h>
#include <stdint.h>

#include "esp_partition.h"

#include "kernels.h"
#include "llm.h"

#define LLM_ESP32_MODEL_LABEL "model"
#define LLM_ESP32_MODEL_SUBTYPE 0x40
/* Internal SRAM left free after a FAST placement: as much as ESP-IDF keeps
 * back for DMA and internal-only allocations on a board with PSRAM
 * (CONFIG_SPIRAM_MALLOC_RESERVE_INTERNAL, 32 KiB in MicroPython's
 * sdkconfig), which a heap_caps_malloc(MALLOC_CAP_INTERNAL) like ours could
 * otherwise take. Measured on the emulated boards after a story, the chat,
 * bench.py --report and a soft reset: see firmware/README.md. */
#define LLM_ESP32_FAST_RESERVE (32u * 1024u)
/* The same on a board without PSRAM, where every allocation of ESP-IDF and
 * MicroPython is internal and IDF keeps nothing back: one free block of this
 * size stays whole, since MicroPython grows its heap by one block when its
 * first one (MPLLM_N8: 40 KiB) fills (opening a file takes 7,680 B at once).
 * Measured on the emulated N8 with a story, the chat, a file written and
 * read, bench.py --report and a soft reset: see firmware/README.md. */
#define LLM_ESP32_FAST_RESERVE_NO_PSRAM (16u * 1024u)
/* The worker's core, unless the caller is on it (then the other one). */
#define LLM_ESP32_WORKER_CORE 0
#define LLM_ESP32_WORKER_STACK 4096u

typedef struct llm_esp32_worker llm_esp32_worker;

typedef struct llm_esp32_port {
    llm_port port;                       /* hand &this->port to llm_open */
    size_t fast_reserve;                 /* see above; may be changed before llm_open */
    size_t fast_reserve_block;           /* of it, one block this large (0: none) */
    uint64_t in_use[LLM_REGION_COUNT];   /* bytes live now, per region placed */
    uint64_t peak[LLM_REGION_COUNT];
    uint64_t asked[LLM_REGION_COUNT];    /* bytes requested, per region wanted */
    uint32_t fast_fallbacks;             /* FAST requests that went to PSRAM */
    int has_psram;                       /* the board has PSRAM mapped into the heap */
    llm_esp32_worker *worker;            /* NULL: single core */
    /* data-cache preloads started and dropped (one was still running) by the
     * preload hook (port_esp32.c; llm_set_preload) */
    uint32_t preloads, preloads_dropped;
} llm_esp32_port;

/* Fill the port and start the core-0 worker. On failure (no memory for the
 * task) returns LLM_E_NOMEM and leaves nothing running. */
llm_status llm_port_esp32_init(llm_esp32_port *p, llm_error *err);
/* Stop the worker (waits for it to exit). Call after llm_close. */
void llm_port_esp32_deinit(llm_esp32_port *p);

/* The port's parallel_rows (llm.h): fn(arg, begin, end) over [0, rows), the
 * upper half on the core-0 worker, the lower half here; returns when both are
 * done. Small ranges, or no worker, run here in one call. */
void llm_esp32_parallel_rows(void *port_ctx, llm_rows_fn fn, void *arg, uint32_t rows);

/* The mapped model image. */
typedef struct llm_esp32_map {
    const uint8_t *data;
    size_t len;                          /* the image's file_bytes, not the partition size */
    esp_partition_mmap_handle_t handle;
    uint32_t partition_address;
    uint32_t partition_size;
} llm_esp32_map;

/* Find the data partition `label` (subtype 0x40), check that it starts with
 * an mpllm image that fits it, and map exactly that image through the flash
 * cache. Errors name the partition and say what to flash. */
llm_status llm_esp32_map_partition(const char *label, llm_esp32_map *map, llm_error *err);
void llm_esp32_unmap(llm_esp32_map *map);

#endif
