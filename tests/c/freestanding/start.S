/*
 * Process entry for the freestanding ESP32-S3 test programs under
 * qemu-xtensa (linux-user), windowed ABI. The loader leaves a1 pointing at
 * argc, then argv[0..argc-1], NULL. a0 = 0 marks the outermost frame; the
 * stack is aligned to 16 with 32 spare bytes for the base save area that a
 * window overflow of this frame writes below the callee's stack pointer.
 * call4 passes a6, a7 as the callee's a2, a3 and returns its a2 in our a6.
 */
    .text
    .global _start
    .type _start, @function
    .align 4
_start:
    movi    a0, 0
    l32i    a6, a1, 0          /* argc */
    addi    a7, a1, 4          /* argv */
    movi    a5, -16
    and     a1, a1, a5
    addi    a1, a1, -32
    call4   fs_main
    mov     a6, a6             /* main's return value is the exit status */
    movi    a2, 119            /* exit_group */
    syscall
1:  j       1b
    .size _start, . - _start
