/*
 * The MicroPython `_llm`'s two halves (modllm.c: the module, the Model and
 * Section types; modllm_call.c: Python objects to the binding core's values
 * and back, around one generic method call).
 */
#ifndef MPLLM_MODLLM_CALL_H
#define MPLLM_MODLLM_CALL_H

#include "py/obj.h"

#include "llm_bind.h"
#include "modllm_platform.h"

typedef struct _llm_model_obj_t {
    mp_obj_base_t base;
    llm_bind_model m;
    mpllm_port_t port; /* m.port points into it: lives as long as the object */
    mpllm_map_t map;   /* valid while mapped */
    bool mapped;
    bool port_ready;
    mp_obj_t source;   /* str it was opened from, or the buffer used in place */
} llm_model_obj_t;

extern const mp_obj_type_t llm_type_Error;

/* Raise what the core decided (an llm_bind_error) as its Python exception. */
MP_NORETURN void llm_raise(const llm_bind_error *e);
void llm_check(llm_bind_kind kind, const llm_bind_error *e);
/* self, or "bad state: the model is closed" */
llm_model_obj_t *llm_ready(mp_obj_t self_in);

/* Model.<method>(*args, **kw) for the core's method `id` (args[0] is self). */
mp_obj_t llm_call(llm_bind_method_id id, size_t n_args, const mp_obj_t *args, mp_map_t *kw);
/* llm_bind_open's poll, between a long prefill's passes: a pending Ctrl-C
 * stops it (the engine then undoes it). */
int llm_poll(void *ctx);
/* mpllm_interrupts_allow(), then a KeyboardInterrupt held back meanwhile is
 * raised at once rather than at the VM's next check: on the unix port's GIL
 * build a second SIGINT that finds the first still pending exits the process
 * (ports/unix/unix_mphal.c, sighandler), so the binding leaves no time
 * between making it pending and raising it. Not for finalisers. */
void llm_interrupts_allow(int held);
/* An int as the core reads it (bool refused, TypeError "<what> must be an
 * int"): its value when it fits in `bits` (63: an int64, 64: a u64 such as a
 * seed, whose bits it gives), otherwise which way it fell out. */
llm_bind_int llm_int(mp_obj_t o, const char *what, int bits);
/* selftest()'s dict: the core's summary plus the lines. */
mp_obj_t llm_selftest_dict(const llm_bind_selftest *t, mp_obj_t lines);
/* plan()'s dict (llm_bind_plan_result). */
mp_obj_t llm_plan_dict(const llm_bind_plan_out *out);

#endif
