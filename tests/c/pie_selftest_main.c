/* Host driver for llm_selftest_run (selftest.c): prints every line and
 * exits with the number of failures (capped at 100). */
#include <stdio.h>

#include "selftest.h"

static void print_line(void *user, const char *line) {
    FILE *out = user;
    fprintf(out, "%s\n", line);
}

int main(void) {
    int failures = llm_selftest_run(print_line, stdout);
    return failures > 100 ? 100 : failures;
}
