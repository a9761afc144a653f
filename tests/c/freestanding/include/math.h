/* math.h subset for the freestanding S3 test programs: only what the engine
 * sources and the drivers use (fabsf is abs.s; sqrtf is a call to
 * fs_libc.c's, as GCC makes it a call to newlib's on the firmware). */
#ifndef FS_MATH_H
#define FS_MATH_H
float sqrtf(float x);
#define fabsf(x) __builtin_fabsf(x)
#define sqrtf(x) __builtin_sqrtf(x)
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#endif
