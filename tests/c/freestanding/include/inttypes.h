/* inttypes.h subset for the freestanding S3 test programs (fs_libc.c).
 * xtensa-elf GCC types int32_t as long int (newlib's stdint convention),
 * hence "l" for the 32-bit ones. */
#ifndef FS_INTTYPES_H
#define FS_INTTYPES_H
#include <stdint.h>
_Static_assert(sizeof(long) == 4, "fs inttypes.h assumes a 32-bit long");
#define PRId32 "ld"
#define PRIu32 "lu"
#define PRIx32 "lx"
#define PRId64 "lld"
#define PRIu64 "llu"
#define PRIx64 "llx"
#endif
