/* ESP32-S3 port layer: see port_esp32.h. */
#include "port_esp32.h"

#include <string.h>

#include "esp32s3/rom/cache.h" /* Cache_Start_DCache_Preload: the ROM's data-cache preload */
#include "esp_err.h"
#include "esp_memory_utils.h" /* esp_ptr_external_ram, esp_ptr_in_drom */
#include "esp_heap_caps.h"
#include "esp_timer.h"
#include "freertos/FreeRTOS.h"
#include "freertos/semphr.h"
#include "freertos/task.h"
#include "freertos/idf_additions.h" /* xTaskCreatePinnedToCore: an ESP-IDF addition */

#include "../port_blocks.h"
#include "align_up.h"
#include "image.h"
#include "image_format.h"
#include "llm_error.h"

/* ---- placement ---------------------------------------------------------- */

#define BLOCK_MAGIC 0x4C4C4D45u

#define CAPS_FAST (MALLOC_CAP_INTERNAL | MALLOC_CAP_8BIT)
#define CAPS_BULK (MALLOC_CAP_SPIRAM | MALLOC_CAP_8BIT)

static void *take(llm_esp32_port *p, size_t total, uint32_t caps, llm_region r, size_t bytes) {
    void *raw = heap_caps_aligned_alloc(16, total, caps);
    if (raw == NULL) return NULL;
    return llm_block_charge(raw, bytes, r, BLOCK_MAGIC, p->in_use, p->peak);
}

static void esp32_free(void *ctx, void *ptr);

/* Internal SRAM for `total` bytes, if the block exists and fast_reserve
 * bytes stay free for everyone else afterwards, fast_reserve_block of them
 * in one block (which block the allocator takes is known only once it has:
 * a placement that breaks up the last such block is given back; one that
 * finds none left, after MicroPython's heap grew into it, is not refused for
 * that). */
static void *take_internal(llm_esp32_port *p, size_t total, size_t bytes) {
    size_t free_now = heap_caps_get_free_size(CAPS_FAST);
    const size_t largest = heap_caps_get_largest_free_block(CAPS_FAST);
    if (largest < total || free_now < total + p->fast_reserve) return NULL;
    const uint64_t peak = p->peak[LLM_REGION_FAST];
    void *out = take(p, total, CAPS_FAST, LLM_REGION_FAST, bytes);
    if (out != NULL && largest >= p->fast_reserve_block &&
        heap_caps_get_largest_free_block(CAPS_FAST) < p->fast_reserve_block) {
        esp32_free(p, out);
        p->peak[LLM_REGION_FAST] = peak;
        return NULL;
    }
    return out;
}

static void *esp32_alloc(void *ctx, size_t bytes, llm_region wanted, llm_region *placed) {
    llm_esp32_port *p = ctx;
    if ((unsigned)wanted >= LLM_REGION_COUNT || bytes > UINT32_MAX - 64u) return NULL;
    p->asked[wanted] += bytes;
    size_t total = sizeof(llm_block_prefix) + (size_t)llm_align_up(bytes, 16u);
    void *out = NULL;
    llm_region r = LLM_REGION_BULK;
    if (wanted == LLM_REGION_FAST || !p->has_psram) {
        out = take_internal(p, total, bytes);
        if (out != NULL) r = LLM_REGION_FAST;
        else if (wanted == LLM_REGION_FAST) p->fast_fallbacks++;
    }
    if (out == NULL && p->has_psram) out = take(p, total, CAPS_BULK, LLM_REGION_BULK, bytes);
    if (out != NULL && placed != NULL) *placed = r;
    return out;
}

static void esp32_free(void *ctx, void *ptr) {
    llm_esp32_port *p = ctx;
    llm_block_prefix *pre = llm_block_discharge(ptr, BLOCK_MAGIC, p->in_use);
    if (pre != NULL) heap_caps_free(pre);
}

/* What esp32_alloc can still give, for llm_plan_open: internal SRAM's free
 * bytes less the reserve take_internal keeps, PSRAM's free bytes (BULK asks
 * go to internal SRAM without PSRAM). A block costs its bytes rounded to 16,
 * the 16-byte prefix and the heap's own header and alignment slack (32 in
 * all: an over-count by a few bytes a block costs a context of a few
 * positions at most, an under-count an open the plan promised). The heap's
 * fragmentation is not modelled: a plan that fits the free bytes but no
 * block is refused by the real open, with its message. */
static void esp32_memory(void *ctx, llm_memory *out) {
    const llm_esp32_port *p = ctx;
    const size_t fast = heap_caps_get_free_size(CAPS_FAST);
    memset(out, 0, sizeof *out);
    out->free[LLM_REGION_FAST] = fast > p->fast_reserve ? fast - p->fast_reserve : 0u;
    out->free[LLM_REGION_BULK] = p->has_psram ? heap_caps_get_free_size(CAPS_BULK) : 0u;
    out->block_overhead = 32u;
    out->bulk_is_fast = !p->has_psram;
}

static uint64_t esp32_now_us(void *ctx) {
    (void)ctx;
    return (uint64_t)esp_timer_get_time();
}

/* ---- the data cache's preload (llm_set_preload) ---------------------------
 *
 * NOT COMPILED HERE (no ESP32-S3 toolchain where it was written): the ROM
 * calls are those esp32s3/rom/cache.h of ESP-IDF v5.5 declares,
 *   uint32_t Cache_Start_DCache_Preload(uint32_t addr, uint32_t size, uint32_t order);
 *   uint32_t Cache_DCache_Preload_Done(void);
 *   void Cache_End_DCache_Preload(uint32_t autoload);
 * (order 0: ascending addresses; Start returns whether auto preload was on,
 * which End restores). IDF's RGB LCD driver (esp_lcd_panel_rgb.c) makes the
 * same Start call, (address, bytes, 0), to stage the next chunk of a PSRAM
 * frame buffer. The cache has one manual preload at a time: a hint
 * that arrives while the last one still runs is dropped, so the engine never
 * waits for it. Only PSRAM and flash-mapped data go through the data cache;
 * other addresses are ignored. A preload only fills cache lines: no byte the
 * engine reads changes, so no result can. Both cores share the cache and may
 * call this at once (the head's two lanes): a spinlock keeps Start/End in
 * pairs. */

static portMUX_TYPE preload_lock = portMUX_INITIALIZER_UNLOCKED;
static int preload_running;
static uint32_t preload_autoload;

static void esp32_preload(void *ctx, const void *addr, size_t bytes) {
    llm_esp32_port *p = ctx;
    if (!(esp_ptr_external_ram(addr) || esp_ptr_in_drom(addr)) || bytes == 0) return;
    portENTER_CRITICAL(&preload_lock);
    if (preload_running && Cache_DCache_Preload_Done()) {
        Cache_End_DCache_Preload(preload_autoload);
        preload_running = 0;
    }
    if (!preload_running) {
        preload_autoload = Cache_Start_DCache_Preload((uint32_t)(uintptr_t)addr, (uint32_t)bytes, 0);
        preload_running = 1;
        p->preloads++;
    } else {
        p->preloads_dropped++;
    }
    portEXIT_CRITICAL(&preload_lock);
}

/* ---- the core-0 worker -------------------------------------------------- */

struct llm_esp32_worker {
    TaskHandle_t task;
    SemaphoreHandle_t go;    /* caller -> worker: a job (or quit) is posted */
    SemaphoreHandle_t done;  /* worker -> caller: the job is finished */
    llm_rows_fn fn;          /* the job; written before `go`, read after it */
    void *arg;
    uint32_t begin, end;
    int quit;
};

static void worker_main(void *param) {
    llm_esp32_worker *w = param;
    for (;;) {
        xSemaphoreTake(w->go, portMAX_DELAY);
        if (w->quit) break;
        w->fn(w->arg, w->begin, w->end);
        xSemaphoreGive(w->done);
    }
    xSemaphoreGive(w->done);
    vTaskDelete(NULL);
}

static void worker_free(llm_esp32_worker *w) {
    if (w->go != NULL) vSemaphoreDelete(w->go);
    if (w->done != NULL) vSemaphoreDelete(w->done);
    heap_caps_free(w);
}

llm_status llm_port_esp32_init(llm_esp32_port *p, llm_error *err) {
    memset(p, 0, sizeof *p);
    p->port.ctx = p;
    p->port.alloc = esp32_alloc;
    p->port.free = esp32_free;
    p->port.now_us = esp32_now_us;
    p->port.memory = esp32_memory;
    p->port.preload = esp32_preload;
    p->has_psram = heap_caps_get_total_size(MALLOC_CAP_SPIRAM) > 0;
    p->fast_reserve = p->has_psram ? LLM_ESP32_FAST_RESERVE : LLM_ESP32_FAST_RESERVE_NO_PSRAM;
    p->fast_reserve_block = p->has_psram ? 0u : LLM_ESP32_FAST_RESERVE_NO_PSRAM;

    llm_esp32_worker *w = heap_caps_calloc(1, sizeof *w, CAPS_FAST);
    if (w == NULL) return llm_fail(err, LLM_E_NOMEM, "no internal RAM for the worker state");
    w->go = xSemaphoreCreateBinary();
    w->done = xSemaphoreCreateBinary();
    if (w->go == NULL || w->done == NULL) {
        worker_free(w);
        return llm_fail(err, LLM_E_NOMEM, "no memory for the worker's semaphores");
    }
    /* same priority as the MicroPython task: above idle, below Wi-Fi/BLE */
    UBaseType_t prio = uxTaskPriorityGet(NULL);
    /* the other core than the caller's: core 0 under MicroPython (which runs
     * on core 1), core 1 for a caller on core 0 such as app_main in the
     * PlatformIO tests; a worker on the caller's own core would split nothing */
    BaseType_t core = xPortGetCoreID() == LLM_ESP32_WORKER_CORE ? 1 - LLM_ESP32_WORKER_CORE
                                                                 : LLM_ESP32_WORKER_CORE;
    if (xTaskCreatePinnedToCore(worker_main, "mpllm_worker", LLM_ESP32_WORKER_STACK, w, prio,
                                &w->task, core) != pdPASS) {
        worker_free(w);
        return llm_fail(err, LLM_E_NOMEM, "cannot start the core-%d worker task (%u bytes "
                         "of stack)", (int)core, (unsigned)LLM_ESP32_WORKER_STACK);
    }
    p->worker = w;
    /* from here on the engine gives the worker half of what it splits: attention's
     * heads and the head's waves and lanes (no matvec: engine.c, matvec_rows) */
    p->port.parallel_rows = llm_esp32_parallel_rows;
    return LLM_OK;
}

void llm_port_esp32_deinit(llm_esp32_port *p) {
    llm_esp32_worker *w = p->worker;
    if (w == NULL) return;
    w->quit = 1;
    xSemaphoreGive(w->go);
    xSemaphoreTake(w->done, portMAX_DELAY); /* the task has left its loop */
    p->worker = NULL;
    worker_free(w);
}

void llm_esp32_parallel_rows(void *port_ctx, llm_rows_fn fn, void *arg, uint32_t rows) {
    llm_esp32_port *p = port_ctx;
    llm_esp32_worker *w = p->worker;
    if (w == NULL || rows < 2u) {
        fn(arg, 0, rows);
        return;
    }
    /* the engine only sends work that pays for the hand-off (llm.h); the
     * split point changes no result */
    uint32_t half = rows / 2u;
    w->fn = fn;
    w->arg = arg;
    w->begin = half;
    w->end = rows;
    xSemaphoreGive(w->go);      /* a full barrier: the job fields are visible */
    fn(arg, 0, half);
    xSemaphoreTake(w->done, portMAX_DELAY);
}

/* ---- the model partition ------------------------------------------------ */

llm_status llm_esp32_map_partition(const char *label, llm_esp32_map *map, llm_error *err) {
    memset(map, 0, sizeof *map);
    const esp_partition_t *part = esp_partition_find_first(
        ESP_PARTITION_TYPE_DATA, (esp_partition_subtype_t)LLM_ESP32_MODEL_SUBTYPE, label);
    if (part == NULL)
        return llm_fail(err, LLM_E_ARG, "no data partition '%s' (subtype 0x%02x) in the "
                         "partition table: flash the mpllm firmware (tools/flash.py)",
                         label, LLM_ESP32_MODEL_SUBTYPE);
    uint8_t head[LLM_IMAGE_HEADER_BYTES];
    esp_err_t rc = esp_partition_read(part, 0, head, sizeof head);
    if (rc != ESP_OK)
        return llm_fail(err, LLM_E_FORMAT, "cannot read partition '%s': %s", label,
                         esp_err_to_name(rc));
    /* the header's own reader (image.c): magic, version, the size it claims */
    uint32_t file_bytes = 0;
    llm_status st = llm_image_claimed_size(head, sizeof head, &file_bytes, err);
    if (st != LLM_OK) {
        char why[sizeof err->message];
        memcpy(why, err->message, sizeof why); /* llm_fail writes err->message */
        return llm_fail(err, st, "partition '%s' holds no usable mpllm model image (%s): flash "
                        "one with tools/flash.py --only model", label, why);
    }
    if (file_bytes > part->size)
        return llm_fail(err, LLM_E_FORMAT, "partition '%s' (%lu bytes) holds an image that "
                         "claims %lu bytes: reflash it with tools/flash.py --only model", label,
                         (unsigned long)part->size, (unsigned long)file_bytes);
    const void *ptr = NULL;
    rc = esp_partition_mmap(part, 0, file_bytes, ESP_PARTITION_MMAP_DATA, &ptr, &map->handle);
    if (rc != ESP_OK)
        return llm_fail(err, LLM_E_NOMEM, "cannot map %lu bytes of partition '%s' into the "
                         "flash cache: %s", (unsigned long)file_bytes, label,
                         esp_err_to_name(rc));
    map->data = ptr;
    map->len = file_bytes;
    map->partition_address = part->address;
    map->partition_size = part->size;
    return LLM_OK;
}

void llm_esp32_unmap(llm_esp32_map *map) {
    if (map->data != NULL) esp_partition_munmap(map->handle);
    memset(map, 0, sizeof *map);
}
