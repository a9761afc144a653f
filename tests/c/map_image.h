/* The image a C test driver was given, mapped read-only; on failure the
 * port's reason goes to stderr and the driver exits with its usage code. */
#ifndef MPLLM_TESTS_MAP_IMAGE_H
#define MPLLM_TESTS_MAP_IMAGE_H

#include <stdio.h>

#include "port_host.h"

static int map_image(const char *path, llm_host_map *map) {
    llm_error err;
    if (llm_host_map_file(path, map, NULL, &err) == LLM_OK) return 1;
    fprintf(stderr, "%s\n", err.message);
    return 0;
}

#endif
