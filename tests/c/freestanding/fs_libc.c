/*
 * The C library subset that the freestanding ESP32-S3 test programs need
 * under qemu-xtensa (linux-user): Linux syscalls for I/O and exit, the
 * string functions, number parsing, a heap and formatted output. It exists
 * so the very sources the host tests run (tests/c/pie_kernels_test.c,
 * pie_selftest_main.c, mathf_dump.c eval) can be built with a bare
 * xtensa-esp32s3-elf GCC that has no newlib (docs/DESIGN-FACTS.md, "The
 * native kernels under QEMU, by hand").
 *
 * Formatted output: flags '-' '0' '+' ' ', width and precision (or '*'),
 * length hh h l ll z, conversions d i u x X c s p a f %. %a prints a double
 * exactly (glibc's form: 0x1.8p+0); %f is exact for the integer part and
 * rounds the fraction (ties to even) through a 64-bit integer after one
 * double multiply, so a digit far down can differ from glibc's: enough for
 * the tables these programs print (no result is compared through %f). Anything else prints as "%?" so an unsupported format is visible.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The byte loops below must stay loops: GCC would otherwise recognise them
 * as memcpy/memset and call themselves. */
#pragma GCC optimize("no-tree-loop-distribute-patterns")

/* ---- syscalls: xtensa linux-user takes the number in a2, the arguments in
 * a6, a3, a4, a5, and returns in a2 (qemu linux-user/xtensa/cpu_loop.c). ---- */
enum { NR_OPEN = 8, NR_CLOSE = 9, NR_READ = 12, NR_WRITE = 13, NR_EXIT_GROUP = 119 };
/* O_* as qemu's linux-user/xtensa takes them (its generic fcntl values) */
enum { FS_O_RDONLY = 0, FS_O_WRONLY = 1, FS_O_CREAT = 0100, FS_O_TRUNC = 01000 };

static long fs_syscall3(long nr, long a, long b, long c) {
    register long r2 __asm__("a2") = nr;
    register long r6 __asm__("a6") = a;
    register long r3 __asm__("a3") = b;
    register long r4 __asm__("a4") = c;
    __asm__ volatile("syscall" : "+r"(r2) : "r"(r6), "r"(r3), "r"(r4) : "memory");
    return r2;
}

static long fs_errno;

void exit(int status) {
    fs_syscall3(NR_EXIT_GROUP, status, 0, 0);
    for (;;) {
    }
}

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        long w = fs_syscall3(NR_WRITE, fd, (long)p, (long)n);
        if (w <= 0) exit(3); /* nowhere left to report to */
        p += w;
        n -= (size_t)w;
    }
}

void abort(void) {
    write_all(2, "abort\n", 6);
    exit(134); /* the shell's status for SIGABRT */
}

/* ---- string ---- */
void *memcpy(void *restrict d, const void *restrict s, size_t n) {
    unsigned char *dp = d;
    const unsigned char *sp = s;
    while (n--) *dp++ = *sp++;
    return d;
}

void *memmove(void *d, const void *s, size_t n) {
    unsigned char *dp = d;
    const unsigned char *sp = s;
    if (dp < sp)
        while (n--) *dp++ = *sp++;
    else
        while (n--) dp[n] = sp[n];
    return d;
}

void *memset(void *d, int c, size_t n) {
    unsigned char *dp = d;
    while (n--) *dp++ = (unsigned char)c;
    return d;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y) return *x < *y ? -1 : 1;
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n; n--, a++, b++) {
        if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        if (!*a) return 0;
    }
    return 0;
}

int strcmp(const char *a, const char *b) { return strncmp(a, b, (size_t)-1); }

/* ---- numbers in ---- */
unsigned long long strtoull(const char *s, char **end, int base) {
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    int neg = 0;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if ((base == 0 || base == 16) && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        base = 16;
    } else if (base == 0) {
        base = p[0] == '0' ? 8 : 10;
    }
    unsigned long long v = 0;
    const char *digits = p;
    for (;; p++) {
        int d = *p >= '0' && *p <= '9'   ? *p - '0'
                : *p >= 'a' && *p <= 'z' ? *p - 'a' + 10
                : *p >= 'A' && *p <= 'Z' ? *p - 'A' + 10
                                         : 99;
        if (d >= base) break;
        v = v * (unsigned)base + (unsigned)d;
    }
    if (end) *end = (char *)(p == digits ? s : p);
    return neg ? 0ull - v : v;
}

unsigned long strtoul(const char *s, char **end, int base) {
    return (unsigned long)strtoull(s, end, base);
}

long strtol(const char *s, char **end, int base) { return (long)strtoull(s, end, base); }

/* ---- heap: power-of-two size classes over a static arena, each block
 * preceded by a 16-byte header holding its class. The test programs free
 * what they allocate and ask for the same sizes again, so per-class free
 * lists reuse everything; blocks are 16-byte aligned (PIE loads need it). */
#define FS_HEAP_BYTES (48u << 20)
#define FS_CLASSES 28
static unsigned char fs_heap[FS_HEAP_BYTES] __attribute__((aligned(16)));
static size_t fs_heap_used;
static void *fs_free_list[FS_CLASSES];

void *malloc(size_t n) {
    unsigned k = 4; /* 16 bytes */
    while (k < FS_CLASSES && ((size_t)1 << k) < n) k++;
    if (k >= FS_CLASSES) return NULL;
    void *p = fs_free_list[k];
    if (p) {
        fs_free_list[k] = *(void **)p;
        return p;
    }
    size_t need = 16u + ((size_t)1 << k);
    if (FS_HEAP_BYTES - fs_heap_used < need) return NULL;
    unsigned char *b = fs_heap + fs_heap_used;
    fs_heap_used += need;
    *(uint32_t *)b = k;
    return b + 16;
}

void *aligned_alloc(size_t align, size_t n) {
    if (align > 16u || (align & (align - 1u))) return NULL;
    return malloc(n);
}

void *calloc(size_t n, size_t size) {
    if (size && n > (size_t)-1 / size) return NULL;
    void *p = malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void free(void *p) {
    if (!p) return;
    uint32_t k = *(uint32_t *)((unsigned char *)p - 16);
    *(void **)p = fs_free_list[k];
    fs_free_list[k] = p;
}

/* ---- formatted output ---- */
typedef struct sink {
    char *buf;   /* string target (snprintf) or staging buffer (fd) */
    size_t cap;  /* bytes buf holds */
    size_t len;  /* bytes produced so far (all of them, as snprintf counts) */
    size_t held; /* bytes in the staging buffer not yet written */
    int fd;      /* -1 for a string */
} sink;

static void put(sink *s, char c) {
    if (s->fd < 0) {
        if (s->len + 1 < s->cap) s->buf[s->len] = c;
    } else {
        if (s->held == s->cap) {
            write_all(s->fd, s->buf, s->held);
            s->held = 0;
        }
        s->buf[s->held++] = c;
    }
    s->len++;
}

static void put_n(sink *s, char c, int n) {
    while (n-- > 0) put(s, c);
}

typedef struct spec {
    int left, zero, plus, space, width, prec;
} spec;

/* sign/prefix, then zero padding or spaces, then the digits */
static void emit(sink *s, const spec *sp, const char *prefix, const char *body, int blen) {
    int plen = (int)strlen(prefix);
    int pad = sp->width - plen - blen;
    if (!sp->left && !sp->zero) put_n(s, ' ', pad);
    for (int i = 0; i < plen; i++) put(s, prefix[i]);
    if (!sp->left && sp->zero) put_n(s, '0', pad);
    for (int i = 0; i < blen; i++) put(s, body[i]);
    if (sp->left) put_n(s, ' ', pad);
}

static int utoa(unsigned long long v, unsigned base, int upper, int min_digits, char *out) {
    char tmp[32];
    int n = 0;
    const char *dig = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    do {
        tmp[n++] = dig[v % base];
        v /= base;
    } while (v);
    while (n < min_digits && n < 30) tmp[n++] = '0';
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

static const char *sign_prefix(const spec *sp, int neg) {
    return neg ? "-" : sp->plus ? "+" : sp->space ? " " : "";
}

/* %a: glibc's form, exact (the hex digits are the double's bits) */
static void fmt_a(sink *s, const spec *sp, double x) {
    uint64_t b;
    memcpy(&b, &x, 8);
    int neg = (int)(b >> 63);
    int e = (int)((b >> 52) & 0x7ff);
    uint64_t m = b & ((1ull << 52) - 1u);
    char body[48];
    int n = 0;
    if (e == 0x7ff) {
        spec plain = *sp;
        plain.zero = 0;
        emit(s, &plain, sign_prefix(sp, neg), m ? "nan" : "inf", 3);
        return;
    }
    int lead = e != 0;
    int exp2 = e ? e - 1023 : (m ? -1022 : 0);
    body[n++] = (char)('0' + lead);
    int digits = 13;
    while (digits > 0 && !((m >> (4 * (13 - digits))) & 0xf)) digits--;
    if (digits) {
        body[n++] = '.';
        for (int i = 0; i < digits; i++) body[n++] = "0123456789abcdef"[(m >> (48 - 4 * i)) & 0xf];
    }
    body[n++] = 'p';
    body[n++] = exp2 < 0 ? '-' : '+';
    n += utoa((unsigned)(exp2 < 0 ? -exp2 : exp2), 10, 0, 1, body + n);
    char prefix[4] = {0};
    const char *sg = sign_prefix(sp, neg);
    size_t k = strlen(sg);
    memcpy(prefix, sg, k);
    prefix[k] = '0';
    prefix[k + 1] = 'x';
    emit(s, sp, prefix, body, n);
}

static void fmt_f(sink *s, const spec *sp, double x) {
    uint64_t b;
    memcpy(&b, &x, 8);
    int neg = (int)(b >> 63);
    if (neg) x = -x;
    char body[64];
    if (x != x || x > 1.8e19) {
        spec plain = *sp;
        plain.zero = 0;
        emit(s, &plain, sign_prefix(sp, neg), x != x ? "nan" : x == __builtin_inf() ? "inf" : "big", 3);
        return;
    }
    int prec = sp->prec < 0 ? 6 : sp->prec > 17 ? 17 : sp->prec;
    unsigned long long scale = 1;
    for (int i = 0; i < prec; i++) scale *= 10u;
    unsigned long long ip = (unsigned long long)x;
    double frac = (x - (double)ip) * (double)scale;
    unsigned long long fp = (unsigned long long)frac;
    double rest = frac - (double)fp; /* ties to even, as glibc rounds */
    if (rest > 0.5 || (rest == 0.5 && ((prec ? fp : ip) & 1u))) fp++;
    if (fp >= scale) {
        ip++;
        fp -= scale;
    }
    int n = utoa(ip, 10, 0, 1, body);
    if (prec) {
        body[n++] = '.';
        n += utoa(fp, 10, 0, prec, body + n);
    }
    emit(s, sp, sign_prefix(sp, neg), body, n);
}

static void format(sink *s, const char *f, va_list ap) {
    for (; *f; f++) {
        if (*f != '%') {
            put(s, *f);
            continue;
        }
        spec sp = {0, 0, 0, 0, 0, -1};
        for (;; f++) {
            if (f[1] == '-') sp.left = 1;
            else if (f[1] == '0') sp.zero = 1;
            else if (f[1] == '+') sp.plus = 1;
            else if (f[1] == ' ') sp.space = 1;
            else if (f[1] == '#') continue;
            else break;
        }
        f++;
        if (*f == '*') {
            sp.width = va_arg(ap, int);
            if (sp.width < 0) sp.left = 1, sp.width = -sp.width;
            f++;
        } else {
            while (*f >= '0' && *f <= '9') sp.width = sp.width * 10 + (*f++ - '0');
        }
        if (*f == '.') {
            f++;
            sp.prec = 0;
            if (*f == '*') {
                sp.prec = va_arg(ap, int);
                f++;
            } else {
                while (*f >= '0' && *f <= '9') sp.prec = sp.prec * 10 + (*f++ - '0');
            }
        }
        int len = 0; /* 0 int, 1 long, 2 long long, -1 short, -2 char, 3 size_t */
        if (*f == 'h') len = f[1] == 'h' ? (f++, -2) : -1, f++;
        else if (*f == 'l') len = f[1] == 'l' ? (f++, 2) : 1, f++;
        else if (*f == 'z') len = 3, f++;
        char body[40];
        int n;
        switch (*f) {
        case 'd':
        case 'i': {
            long long v = len == 2 ? va_arg(ap, long long)
                          : len == 1 ? va_arg(ap, long)
                          : len == 3 ? (long long)va_arg(ap, size_t)
                                     : va_arg(ap, int);
            if (len == -1) v = (short)v;
            if (len == -2) v = (signed char)v;
            unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
            n = utoa(u, 10, 0, sp.prec < 0 ? 1 : sp.prec, body);
            if (sp.prec >= 0) sp.zero = 0;
            emit(s, &sp, sign_prefix(&sp, v < 0), body, n);
            break;
        }
        case 'u':
        case 'x':
        case 'X':
        case 'p': {
            unsigned long long u = *f == 'p'  ? (uintptr_t)va_arg(ap, void *)
                                   : len == 2 ? va_arg(ap, unsigned long long)
                                   : len == 1 ? va_arg(ap, unsigned long)
                                   : len == 3 ? va_arg(ap, size_t)
                                              : va_arg(ap, unsigned);
            if (len == -1) u = (unsigned short)u;
            if (len == -2) u = (unsigned char)u;
            n = utoa(u, *f == 'u' ? 10u : 16u, *f == 'X', sp.prec < 0 ? 1 : sp.prec, body);
            if (sp.prec >= 0) sp.zero = 0;
            emit(s, &sp, *f == 'p' ? "0x" : "", body, n);
            break;
        }
        case 'c':
            body[0] = (char)va_arg(ap, int);
            sp.zero = 0;
            emit(s, &sp, "", body, 1);
            break;
        case 's': {
            const char *str = va_arg(ap, const char *);
            if (!str) str = "(null)";
            int sl = (int)strlen(str);
            if (sp.prec >= 0 && sl > sp.prec) sl = sp.prec;
            sp.zero = 0;
            emit(s, &sp, "", str, sl);
            break;
        }
        case 'a':
            fmt_a(s, &sp, va_arg(ap, double));
            break;
        case 'f':
            fmt_f(s, &sp, va_arg(ap, double));
            break;
        case '%':
            put(s, '%');
            break;
        default:
            put(s, '%');
            put(s, '?');
            if (!*f) return;
        }
    }
}

struct FILE {
    int fd;
};
static FILE fs_files[3 + 8] = {{0}, {1}, {2}};
FILE *const stdin = &fs_files[0], *const stdout = &fs_files[1], *const stderr = &fs_files[2];

static int vfd(int fd, const char *fmt, va_list ap) {
    char stage[256];
    sink s = {stage, sizeof stage, 0, 0, fd};
    format(&s, fmt, ap);
    write_all(fd, stage, s.held);
    return (int)s.len;
}

int vsnprintf(char *buf, size_t n, const char *fmt, va_list ap) {
    sink s = {buf, n, 0, 0, -1};
    format(&s, fmt, ap);
    if (n) buf[s.len < n ? s.len : n - 1] = '\0';
    return (int)s.len;
}

int snprintf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return r;
}

int printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vfd(1, fmt, ap);
    va_end(ap);
    return r;
}

int fprintf(FILE *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vfd(f->fd, fmt, ap);
    va_end(ap);
    return r;
}

int puts(const char *str) {
    write_all(1, str, strlen(str));
    write_all(1, "\n", 1);
    return 0;
}

/* ---- files: unbuffered, straight to the syscalls ---- */
FILE *fopen(const char *path, const char *mode) {
    int flags = mode[0] == 'w' ? FS_O_WRONLY | FS_O_CREAT | FS_O_TRUNC : FS_O_RDONLY;
    if (mode[0] != 'r' && mode[0] != 'w') return NULL;
    long fd = fs_syscall3(NR_OPEN, (long)path, flags, 0644);
    if (fd < 0) {
        fs_errno = -fd;
        return NULL;
    }
    for (size_t i = 3; i < sizeof fs_files / sizeof fs_files[0]; i++)
        if (fs_files[i].fd == 0) {
            fs_files[i].fd = (int)fd;
            return &fs_files[i];
        }
    fs_syscall3(NR_CLOSE, fd, 0, 0);
    return NULL;
}

size_t fread(void *p, size_t size, size_t n, FILE *f) {
    size_t want = size * n, got = 0;
    while (got < want) {
        long r = fs_syscall3(NR_READ, f->fd, (long)((char *)p + got), (long)(want - got));
        if (r <= 0) {
            if (r < 0) fs_errno = -r;
            break;
        }
        got += (size_t)r;
    }
    return size ? got / size : 0;
}

size_t fwrite(const void *p, size_t size, size_t n, FILE *f) {
    size_t want = size * n, done = 0;
    while (done < want) {
        long r = fs_syscall3(NR_WRITE, f->fd, (long)((const char *)p + done), (long)(want - done));
        if (r <= 0) {
            if (r < 0) fs_errno = -r;
            break;
        }
        done += (size_t)r;
    }
    return size ? done / size : 0;
}

int fclose(FILE *f) {
    long r = fs_syscall3(NR_CLOSE, f->fd, 0, 0);
    if (f >= &fs_files[3]) f->fd = 0;
    return r < 0 ? -1 : 0;
}

void perror(const char *str) { fprintf(stderr, "%s: error %ld\n", str, fs_errno); }

/* ---- sqrtf: GCC 12 has no inline square root for this core, so sqrtf is a
 * library call on the S3 too (newlib's, correctly rounded as IEEE 754 asks).
 * Here: x = f * 2^p with f in [1, 4), p even; F = f * 2^46 is an integer
 * whose integer square root q is sqrt(f) * 2^23 truncated to 24 bits; the
 * exact root exceeds q + 1/2 exactly when F - q^2 > q (never a tie). ---- */
static uint64_t isqrt64(uint64_t n) {
    uint64_t r = 0, bit = 1ull << 62;
    while (bit > n) bit >>= 2;
    while (bit) {
        if (n >= r + bit) {
            n -= r + bit;
            r = (r >> 1) + bit;
        } else {
            r >>= 1;
        }
        bit >>= 2;
    }
    return r;
}

#undef sqrtf
float sqrtf(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) == 0 || b == 0x7f800000u) return x; /* +-0, +inf */
    if ((b & 0x7fffffffu) > 0x7f800000u) {                     /* NaN: quieted */
        b |= 0x00400000u;
    } else if (b >> 31) {                                      /* negative: NaN */
        b = 0x7fc00000u;
    } else {
        int e = (int)(b >> 23);
        uint32_t mm = b & 0x7fffffu;
        if (e == 0) { /* subnormal: normalise the significand */
            e = 1;
            while (mm < 0x800000u) mm <<= 1, e--;
        } else {
            mm |= 0x800000u;
        }
        int p = e - 127; /* x = (mm / 2^23) * 2^p */
        uint64_t big = (uint64_t)mm << 23;
        if (p & 1) big <<= 1, p -= 1;
        uint64_t q = isqrt64(big);
        if (big - q * q > q) q++;
        /* q in [2^23, 2^24]: 2^24 carries into the exponent, as it should */
        b = ((uint32_t)(p / 2 + 127) << 23) + (uint32_t)(q - 0x800000u);
    }
    memcpy(&x, &b, 4);
    return x;
}

/* start.S calls this with the loader's argc and argv */
int main(int argc, char **argv);
int fs_main(int argc, char **argv);
int fs_main(int argc, char **argv) { return main(argc, argv); }
