/* An image opened as a board places it, through the binding's Model() path
 * (llm_bind_open: context 0 is the default, open_fitting's choice), with the
 * host port's regions capped as the board's memory: FAST (internal SRAM) at
 * FAST_CAP, BULK at BULK_CAP (the N16R8: PSRAM; the N8 without PSRAM: FAST_CAP
 * 0 refuses FAST, so everything lands in BULK, its one internal SRAM).
 * tests/test_costmodel.py runs it on stories260K as convert.py writes it by
 * default and holds the cost model's placement on both boards to what it prints.
 *
 *   board_open IMAGE FAST_CAP BULK_CAP CONTEXT...
 *
 * For each context: "context N: opens at S" and one "block NAME BYTES REGION"
 * line per placement (REGION: fast, bulk or flash), or "context N: refused: WHY". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "llm_bind.h"
#include "map_image.h"
#include "port_host.h"

static const char *region_name(llm_region r) {
    return r == LLM_REGION_FLASH ? "flash" : r == LLM_REGION_FAST ? "fast" : "bulk";
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: board_open IMAGE FAST_CAP BULK_CAP CONTEXT...\n");
        return 2;
    }
    llm_host_map map;
    if (!map_image(argv[1], &map)) return 2;
    const unsigned long long fast = strtoull(argv[2], NULL, 10);
    const unsigned long long bulk = strtoull(argv[3], NULL, 10);
    for (int a = 4; a < argc; a++) {
        const uint32_t context = (uint32_t)strtoul(argv[a], NULL, 10);
        llm_host_port hp;
        llm_port_host_init(&hp);
        hp.capacity[LLM_REGION_FAST] = fast ? fast : 1u; /* 0 would mean unlimited */
        hp.capacity[LLM_REGION_BULK] = bulk;
        llm_bind_model m;
        memset(&m, 0, sizeof m);
        m.port = &hp.port;
        llm_bind_error be;
        if (llm_bind_open(&m, map.data, map.len, 0, 0, context, NULL, &be) != LLM_BIND_OK) {
            printf("context %u: refused: %s\n", context, be.message);
            continue;
        }
        printf("context %u: opens at %u\n", context, llm_get_config(m.engine)->seq_len);
        for (uint32_t i = 0; i < llm_placement_count(m.engine); i++) {
            const llm_placement *p = llm_placement_at(m.engine, i);
            printf("block %s %u %s\n", p->name, p->bytes, region_name(p->region));
        }
        llm_bind_close(&m);
    }
    llm_host_unmap(&map);
    return 0;
}
