/* stdlib.h subset for the freestanding S3 test programs (fs_libc.c). */
#ifndef FS_STDLIB_H
#define FS_STDLIB_H
#include <stddef.h>
void *malloc(size_t n);
void *aligned_alloc(size_t align, size_t n);
void *calloc(size_t n, size_t size);
void free(void *p);
void exit(int status) __attribute__((noreturn));
void abort(void) __attribute__((noreturn));
long strtol(const char *s, char **end, int base);
unsigned long strtoul(const char *s, char **end, int base);
unsigned long long strtoull(const char *s, char **end, int base);
#endif
