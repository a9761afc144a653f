/* Host port: see port_host.h. */
#define _POSIX_C_SOURCE 200809L

#include "port_host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../port_blocks.h"
#include "align_up.h"
#include "llm_error.h"

#define BLOCK_MAGIC 0x4C4C4D48u

static int fits(const llm_host_port *hp, llm_region r, uint64_t bytes) {
    return hp->capacity[r] == 0 || hp->in_use[r] + bytes <= hp->capacity[r];
}

static void *host_alloc(void *ctx, size_t bytes, llm_region wanted, llm_region *placed) {
    llm_host_port *hp = ctx;
    if ((unsigned)wanted >= LLM_REGION_COUNT || wanted == LLM_REGION_FLASH) return NULL;
    hp->asked[wanted] += bytes;
    llm_region r = wanted;
    if (!fits(hp, r, bytes)) {
        if (r == LLM_REGION_FAST && fits(hp, LLM_REGION_BULK, bytes))
            r = LLM_REGION_BULK;
        else
            return NULL;
    }
    const uint64_t rounded = llm_align_up(bytes, 16u);
    if (rounded < bytes || rounded > SIZE_MAX - sizeof(llm_block_prefix)) return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, 16, sizeof(llm_block_prefix) + (size_t)(rounded ? rounded : 16u)) != 0)
        return NULL;
    hp->live_blocks++;
    if (placed) *placed = r;
    return llm_block_charge(raw, bytes, r, BLOCK_MAGIC, hp->in_use, hp->peak);
}

static void host_free(void *ctx, void *ptr) {
    llm_host_port *hp = ctx;
    llm_block_prefix *pre = llm_block_discharge(ptr, BLOCK_MAGIC, hp->in_use);
    if (pre == NULL) return;
    hp->live_blocks--;
    free(pre);
}

/* What host_alloc can still give: its capacity less what is in use. It
 * charges a block its bytes (no overhead), and a FAST request over capacity
 * goes to BULK: llm_memory's rule with block_overhead 0. */
static void host_memory(void *ctx, llm_memory *out) {
    const llm_host_port *hp = ctx;
    memset(out, 0, sizeof *out);
    for (int r = LLM_REGION_FAST; r < LLM_REGION_COUNT; r++)
        out->free[r] = hp->capacity[r] == 0 ? LLM_MEMORY_UNLIMITED
                       : hp->in_use[r] >= hp->capacity[r] ? 0u
                                                          : hp->capacity[r] - hp->in_use[r];
}

static uint64_t host_now_us(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void host_preload(void *ctx, const void *addr, size_t bytes) {
    llm_host_port *hp = ctx;
    (void)addr; /* a hint: nothing to stage on the host, only counted */
    hp->preloads++;
    hp->preload_bytes += bytes;
}

void llm_port_host_init(llm_host_port *hp) {
    memset(hp, 0, sizeof *hp);
    hp->port.ctx = hp;
    hp->port.alloc = host_alloc;
    hp->port.free = host_free;
    hp->port.now_us = host_now_us;
    hp->port.memory = host_memory;
    hp->port.preload = host_preload;
}

static llm_status map_fail(llm_error *err, int *sys_errno, int e, const char *path,
                           const char *what) {
    if (sys_errno) *sys_errno = e;
    return llm_fail(err, LLM_E_ARG, "cannot %s '%s': %s", what, path,
                    e ? strerror(e) : "unknown error");
}

llm_status llm_host_map_file(const char *path, llm_host_map *map, int *sys_errno,
                             llm_error *err) {
    map->data = NULL;
    map->len = 0;
    if (sys_errno) *sys_errno = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return map_fail(err, sys_errno, errno, path, "open model image");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return map_fail(err, sys_errno, e, path, "stat model image");
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return map_fail(err, sys_errno, EISDIR, path, "map model image");
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return llm_fail(err, LLM_E_ARG, "cannot map model image '%s': not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return llm_fail(err, LLM_E_ARG, "model image '%s' is empty (0 bytes)", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return map_fail(err, sys_errno, EFBIG, path, "map model image");
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping stays valid */
    if (p == MAP_FAILED) return map_fail(err, sys_errno, e, path, "map model image");
    map->data = p;
    map->len = (size_t)st.st_size;
    return LLM_OK;
}

void llm_host_unmap(llm_host_map *map) {
    if (map->data != NULL) munmap((void *)(uintptr_t)map->data, map->len);
    map->data = NULL;
    map->len = 0;
}
