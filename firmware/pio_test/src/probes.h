/*
 * Bandwidth probes for the N16R8 (run by the PlatformIO tests). Each returns
 * what it measured and prints one line:
 *   "PROBE <name> <value> <unit> (<detail>)"
 * The numbers feed the cost model's constants (tools/mpllm/costmodel/): PSRAM through the
 * data cache (sequential and strided, i.e. one touch per cache line), internal
 * SRAM, and random row reads from the memory-mapped `model` partition.
 */
#ifndef MPLLM_PROBES_H
#define MPLLM_PROBES_H

#include <stddef.h>
#include <stdint.h>

/* MB/s (1e6 bytes) reading `bytes` of PSRAM sequentially, 32-bit loads. */
double probe_psram_seq(size_t bytes);
/* MB/s of cache lines fetched when touching one word every `stride` bytes. */
double probe_psram_strided(size_t bytes, size_t stride);
/* MB/s reading an internal SRAM buffer sequentially. */
double probe_sram_seq(size_t bytes);
/* Mean microseconds per random `row_bytes` read from the mapped `model`
 * partition (`rows` reads, fixed-seed offsets); < 0 if there is no partition. */
double probe_flash_rows(size_t row_bytes, uint32_t rows);

#endif
