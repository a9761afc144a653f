/* Bandwidth probes: see probes.h. */
#include "probes.h"

#include <stdio.h>
#include <string.h>

#include "esp_heap_caps.h"
#include "esp_partition.h"
#include "esp_timer.h"

#include "port_esp32.h"

/* Summing into a volatile sink keeps the loads from being optimised away. */
static volatile uint32_t sink;

static uint32_t sum_words(const uint32_t *p, size_t n, size_t step) {
    uint32_t s = 0;
    for (size_t i = 0; i < n; i += step) s += p[i];
    return s;
}

static double mbps(size_t bytes, int64_t us) {
    return us > 0 ? (double)bytes / (double)us : 0.0;
}

static double read_probe(const char *name, uint32_t caps, size_t bytes, size_t stride) {
    uint32_t *buf = heap_caps_aligned_alloc(64, bytes, caps | MALLOC_CAP_8BIT);
    if (buf == NULL) {
        printf("PROBE %s unavailable (no %u bytes)\n", name, (unsigned)bytes);
        return 0.0;
    }
    for (size_t i = 0; i < bytes / 4; i++) buf[i] = (uint32_t)i * 2654435761u;
    size_t step = stride / 4;
    sink += sum_words(buf, bytes / 4, step); /* warm up TLB/MMU, evict the writes */
    int64_t t0 = esp_timer_get_time();
    sink += sum_words(buf, bytes / 4, step);
    int64_t us = esp_timer_get_time() - t0;
    heap_caps_free(buf);
    /* every touched word pulls one whole cache line when stride >= the line */
    size_t line = CONFIG_ESP32S3_DATA_CACHE_LINE_SIZE;
    size_t fetched = stride >= line ? bytes / stride * line : bytes;
    double v = mbps(fetched, us);
    printf("PROBE %s %.1f MB/s (%u bytes, stride %u, %lld us)\n", name, v, (unsigned)bytes,
           (unsigned)stride, (long long)us);
    return v;
}

double probe_psram_seq(size_t bytes) {
    return read_probe("psram_seq", MALLOC_CAP_SPIRAM, bytes, 4);
}

double probe_psram_strided(size_t bytes, size_t stride) {
    return read_probe("psram_strided", MALLOC_CAP_SPIRAM, bytes, stride);
}

double probe_sram_seq(size_t bytes) {
    return read_probe("sram_seq", MALLOC_CAP_INTERNAL, bytes, 4);
}

double probe_flash_rows(size_t row_bytes, uint32_t rows) {
    const esp_partition_t *part = esp_partition_find_first(
        ESP_PARTITION_TYPE_DATA, (esp_partition_subtype_t)LLM_ESP32_MODEL_SUBTYPE,
        LLM_ESP32_MODEL_LABEL);
    if (part == NULL) {
        printf("PROBE flash_rows unavailable (no '%s' partition)\n", LLM_ESP32_MODEL_LABEL);
        return -1.0;
    }
    const void *map = NULL;
    esp_partition_mmap_handle_t h;
    if (esp_partition_mmap(part, 0, part->size, ESP_PARTITION_MMAP_DATA, &map, &h) != ESP_OK) {
        printf("PROBE flash_rows unavailable (cannot map %u bytes)\n", (unsigned)part->size);
        return -1.0;
    }
    const uint8_t *base = map;
    size_t n_rows = part->size / row_bytes;
    uint32_t x = 0x9E3779B9u; /* xorshift32: fixed offsets, spread over 13 MiB */
    uint32_t s = 0;
    int64_t t0 = esp_timer_get_time();
    for (uint32_t i = 0; i < rows; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        size_t off = ((size_t)(x % n_rows) * row_bytes) & ~(size_t)3u; /* word loads */
        const uint32_t *row = (const uint32_t *)(const void *)(base + off);
        s += sum_words(row, row_bytes / 4, 1);
    }
    int64_t us = esp_timer_get_time() - t0;
    sink += s;
    esp_partition_munmap(h);
    double per = (double)us / (double)rows;
    printf("PROBE flash_rows %.2f us/row (%u-byte rows, %u random reads)\n", per,
           (unsigned)row_bytes, (unsigned)rows);
    return per;
}
