/* math.h subset for the freestanding S3 test programs: only what the engine
 * sources and the drivers use, as the compiler's builtins (fabsf is abs.s;
 * sqrtf is the FPU sequence, with fs_libc.c's sqrtf behind it for the
 * errno path GCC keeps for negative inputs). */
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
