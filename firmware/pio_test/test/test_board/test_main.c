/*
 * On-device tests (PlatformIO + Unity) for the ESP32-S3 N16R8.
 * Each test prints what it measured; see firmware/README.md for the numbers.
 */
#include <stdio.h>

#include <unity.h>

#include "esp_heap_caps.h"
#include "esp_idf_version.h"
#include "esp_timer.h"

#include "kernels.h"
#include "port_esp32.h"
#include "probes.h"
#include "selftest.h"

void setUp(void) {}
void tearDown(void) {}

static void print_line(void *user, const char *line) {
    (void)user;
    printf("%s\n", line);
}

/* Every PIE kernel equals its scalar reference; float probes equal IEEE-754. */
static void test_kernel_selftest(void) {
    printf("esp-idf %s, kernels=%s\n", esp_get_idf_version(), LLM_KERNELS_NAME);
    TEST_ASSERT_EQUAL_INT(0, llm_selftest_run(print_line, NULL));
}

static uint32_t rng = 12345u;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* A head-sized matvec split across both cores gives the bytes one core gives. */
static void test_two_core_matvec_is_identical(void) {
    const uint32_t rows = 4096, cols = 96, row_bytes = 48;
    uint8_t *codes = heap_caps_aligned_alloc(16, (size_t)rows * row_bytes, MALLOC_CAP_SPIRAM);
    float *scales = heap_caps_aligned_alloc(16, rows * sizeof(float), MALLOC_CAP_SPIRAM);
    float *y1 = heap_caps_aligned_alloc(16, rows * sizeof(float), MALLOC_CAP_INTERNAL);
    float *y2 = heap_caps_aligned_alloc(16, rows * sizeof(float), MALLOC_CAP_INTERNAL);
    int8_t xq[96] __attribute__((aligned(16)));
    TEST_ASSERT_NOT_NULL(codes);
    TEST_ASSERT_NOT_NULL(scales);
    TEST_ASSERT_NOT_NULL(y1);
    TEST_ASSERT_NOT_NULL(y2);
    for (size_t i = 0; i < (size_t)rows * row_bytes; i++) codes[i] = (uint8_t)next_u32();
    for (uint32_t r = 0; r < rows; r++) scales[r] = (float)(next_u32() % 1000 + 1) * 1e-4f;
    float x[96];
    for (int i = 0; i < 96; i++) x[i] = (float)((int)(next_u32() % 2001) - 1000) * 1e-3f;
    float xscale;
    llm_quantize_act(x, cols, 96, xq, &xscale);
    llm_q4 w = {codes, scales, rows, cols, 128, 1, row_bytes};

    llm_esp32_port port;
    llm_error err;
    TEST_ASSERT_EQUAL_INT(LLM_OK, llm_port_esp32_init(&port, &err));
    int64_t t0 = esp_timer_get_time();
    llm_matvec_q4(&w, xq, xscale, y1, 0, rows);
    int64_t t1 = esp_timer_get_time();
    llm_matvec_job job = {&w, xq, xscale, y2};
    llm_esp32_parallel_rows(&port, llm_matvec_job_rows, &job, rows);
    int64_t t2 = esp_timer_get_time();
    llm_port_esp32_deinit(&port);
    printf("matvec %ux%u: one core %lld us, two cores %lld us\n", (unsigned)rows,
           (unsigned)cols, (long long)(t1 - t0), (long long)(t2 - t1));
    TEST_ASSERT_EQUAL_MEMORY(y1, y2, rows * sizeof(float));
    heap_caps_free(codes);
    heap_caps_free(scales);
    heap_caps_free(y1);
    heap_caps_free(y2);
}

static void test_bandwidth_probes(void) {
    TEST_ASSERT_TRUE(probe_psram_seq(4u << 20) > 0.0);
    TEST_ASSERT_TRUE(probe_psram_strided(4u << 20, 64) > 0.0);
    TEST_ASSERT_TRUE(probe_psram_strided(4u << 20, 512) > 0.0);
    TEST_ASSERT_TRUE(probe_sram_seq(64u << 10) > 0.0);
    /* one embedding row with its scale and one PLE row (image_format.h; firmware/README.md) */
    double emb = probe_flash_rows(48 + 4, 2000);
    double ple = probe_flash_rows(400, 2000);
    if (emb < 0 || ple < 0) TEST_IGNORE_MESSAGE("no model partition: flash the mpllm table");
}

void app_main(void) {
    UNITY_BEGIN();
    RUN_TEST(test_kernel_selftest);
    RUN_TEST(test_two_core_matvec_is_identical);
    RUN_TEST(test_bandwidth_probes);
    UNITY_END();
}
