/* stdio.h subset for the freestanding S3 test programs (fs_libc.c): formatted
 * output to fd 1/2 and raw file reads and writes through linux-user
 * syscalls. The format subset is in fs_libc.c's fs_vformat. */
#ifndef FS_STDIO_H
#define FS_STDIO_H
#include <stdarg.h>
#include <stddef.h>

typedef struct FILE FILE;
extern FILE *const stdin, *const stdout, *const stderr;

int printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int fprintf(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int snprintf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int vsnprintf(char *buf, size_t n, const char *fmt, va_list ap);
int puts(const char *s);
FILE *fopen(const char *path, const char *mode);
size_t fread(void *p, size_t size, size_t n, FILE *f);
size_t fwrite(const void *p, size_t size, size_t n, FILE *f);
int fclose(FILE *f);
void perror(const char *s);
#endif
