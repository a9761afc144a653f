/* Python objects to the binding core's values and back (modllm_call.h). */
#include <string.h>

#include "py/objint.h"
#include "py/objstr.h"
#include "py/objtuple.h"
#include "py/runtime.h"
#include "py/smallint.h"

#include "modllm_call.h"

/* _llm.Error, a RuntimeError like the CPython binding's. */
MP_DEFINE_CONST_OBJ_TYPE(llm_type_Error, MP_QSTR_Error, MP_TYPE_FLAG_NONE,
    make_new, mp_obj_exception_make_new, print, mp_obj_exception_print,
    attr, mp_obj_exception_attr, parent, &mp_type_RuntimeError);

/* The one place a decision of the core becomes a Python exception. */
MP_NORETURN void llm_raise(const llm_bind_error *e) {
    const mp_obj_type_t *type = &llm_type_Error;
    if (e->kind == LLM_BIND_TYPE_ERROR) {
        type = &mp_type_TypeError;
    } else if (e->kind == LLM_BIND_VALUE_ERROR) {
        type = &mp_type_ValueError;
    } else if (e->kind == LLM_BIND_MEMORY_ERROR) {
        type = &mp_type_MemoryError;
    } else if (e->kind == LLM_BIND_INDEX_ERROR) {
        type = &mp_type_IndexError;
    } else if (e->kind == LLM_BIND_OS_ERROR) {
        mp_obj_t args[2] = {MP_OBJ_NEW_SMALL_INT(e->sys_errno),
                            mp_obj_new_str(e->message, strlen(e->message))};
        nlr_raise(mp_obj_exception_make_new(&mp_type_OSError, 2, 0, args));
    } else if (e->kind == LLM_BIND_INTERRUPT) {
        /* the poll saw a pending KeyboardInterrupt (the board's, or the SIGINT
         * mpllm_interrupts_allow() has just scheduled): raise it now */
        mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
        mp_raise_type(&mp_type_KeyboardInterrupt);
    }
    mp_raise_msg_varg(type, MP_ERROR_TEXT("%s"), e->message);
}

void llm_check(llm_bind_kind kind, const llm_bind_error *e) {
    if (kind != LLM_BIND_OK) {
        llm_raise(e);
    }
}

llm_model_obj_t *llm_ready(mp_obj_t self_in) {
    llm_model_obj_t *self = MP_OBJ_TO_PTR(self_in);
    llm_bind_error e;
    llm_check(llm_bind_ready(&self->m, &e), &e);
    return self;
}

void llm_interrupts_allow(int held) {
    mpllm_interrupts_allow(held);
    if (!held) {
        mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
    }
}

llm_bind_int llm_int(mp_obj_t o, const char *what, int bits) {
    llm_bind_error e;
    if (!mp_obj_is_int(o) || mp_obj_is_bool(o)) {
        llm_bind_not_int(what, mp_obj_get_type_str(o), &e);
        llm_raise(&e);
    }
    llm_bind_int v = {0, 0};
    const int sign = mp_obj_int_sign(o);
    uint8_t b[8];
    if (mp_obj_is_small_int(o)) {
        v.value = MP_OBJ_SMALL_INT_VALUE(o);
    } else if (!mp_obj_int_to_bytes_impl(o, false, sizeof(b), b)) {
        v.overflow = sign < 0 ? -1 : 1; /* more than 64 bits either way */
    } else {
        uint64_t u = 0; /* a positive int's bits, a negative one's two's complement */
        for (int i = 7; i >= 0; i--) {
            u = (u << 8) | b[i];
        }
        v.overflow = sign > 0 && bits == 63 && (u >> 63) ? 1 : 0;
        v.value = (int64_t)u;
    }
    if (bits == 64 && sign < 0) {
        v.overflow = -1; /* a negative seed */
    }
    if (v.overflow) {
        v.value = 0;
    }
    return v;
}

int llm_poll(void *ctx) {
    (void)ctx;
    return MP_STATE_THREAD(mp_pending_exception) != MP_OBJ_NULL || mpllm_interrupt_pending();
}

/* ---- return values: the core's values as objects ----------------------- */

typedef struct {
    mp_obj_t at[LLM_BIND_MAX_DEPTH + 1]; /* the return value, then the containers in it */
} llm_builder;

static int llm_put(void *ctx, const llm_bind_value *v) {
    llm_builder *b = ctx;
    mp_obj_t o = mp_const_none;
    switch (v->type) {
        /* a small int when it fits (token ids, positions): mp_obj_new_int_from_ll
         * always makes a heap long int, one per token, slow in every later
         * comparison, subscript and dict lookup */
        case LLM_BIND_INT:
            o = v->i >= MP_SMALL_INT_MIN && v->i <= MP_SMALL_INT_MAX
                    ? MP_OBJ_NEW_SMALL_INT((mp_int_t)v->i)
                    : mp_obj_new_int_from_ll(v->i);
            break;
        case LLM_BIND_FLOAT: o = mp_obj_new_float((mp_float_t)v->f); break;
        case LLM_BIND_BOOL: o = mp_obj_new_bool(v->i); break;
        case LLM_BIND_STR: o = mp_obj_new_str(v->p, v->n); break;
        case LLM_BIND_BYTES: o = mp_obj_new_bytes(v->p, v->n); break;
        case LLM_BIND_LIST: o = mp_obj_new_list(v->n, NULL); break;
        case LLM_BIND_TUPLE: o = mp_obj_new_tuple(v->n, NULL); break;
        case LLM_BIND_DICT: o = mp_obj_new_dict(v->n); break;
        default: break;
    }
    mp_obj_t in = v->depth > 0 ? b->at[v->depth - 1] : MP_OBJ_NULL;
    if (in != MP_OBJ_NULL && mp_obj_is_dict_or_ordereddict(in)) {
        mp_obj_dict_store(in, mp_obj_new_str(v->key, strlen(v->key)), o);
    } else if (in != MP_OBJ_NULL) {
        size_t len;
        mp_obj_t *items;
        mp_obj_get_array(in, &len, &items);
        items[v->index] = o;
    }
    b->at[v->depth] = o;
    return 1;
}

/* The return value, built with the model busy: an allocation may run a
 * finaliser that would otherwise close the model under the result's reads.
 * Busy is cleared however the building ends (MemoryError included). */
static mp_obj_t llm_result(llm_model_obj_t *self, llm_bind_method_id id, const llm_bind_out *out) {
    llm_builder b = {{mp_const_none}};
    const llm_bind_sink sink = {llm_put, &b};
    nlr_buf_t nlr;
    self->m.busy = 1;
    if (nlr_push(&nlr) == 0) {
        llm_bind_result(&self->m, id, out, &sink);
        nlr_pop();
        self->m.busy = 0;
        return b.at[0];
    }
    self->m.busy = 0;
    nlr_jump(nlr.ret_val);
}

/* ---- methods: one generic call, the core's table says the arguments ----- */

/* list(o), or the core's TypeError when o is not iterable (what the CPython
 * binding says: only the failure to iterate is reworded, not one raised
 * while iterating) */
static mp_obj_t llm_token_list(mp_obj_t o, const char *what) {
    nlr_buf_t nlr;
    mp_obj_t iter = MP_OBJ_NULL;
    if (nlr_push(&nlr) == 0) {
        iter = mp_getiter(o, NULL);
        nlr_pop();
    } else {
        const mp_obj_type_t *raised = ((mp_obj_base_t *)nlr.ret_val)->type;
        if (!mp_obj_is_subclass_fast(MP_OBJ_FROM_PTR(raised), MP_OBJ_FROM_PTR(&mp_type_TypeError))) {
            nlr_jump(nlr.ret_val);
        }
        llm_bind_error e;
        llm_bind_not_tokens(what, mp_obj_get_type_str(o), &e);
        llm_raise(&e);
    }
    return mp_call_function_1(MP_OBJ_FROM_PTR(&mp_type_list), iter);
}

mp_obj_t llm_call(llm_bind_method_id id, size_t n_args, const mp_obj_t *args,
    mp_map_t *kw) {
    const llm_bind_method *meth = llm_bind_method_at(id);
    const size_t n_pos = n_args - 1, max = LLM_BIND_MAX_PARAMS;
    mp_obj_t vals[2 * LLM_BIND_MAX_PARAMS];
    const char *names[LLM_BIND_MAX_PARAMS];
    memcpy(vals, args + 1, (n_pos < max ? n_pos : max) * sizeof(mp_obj_t));
    size_t n_kw = 0;
    for (size_t i = 0; kw != NULL && i < kw->alloc; i++) {
        if (mp_map_slot_is_filled(kw, i) && n_kw++ < max) {
            names[n_kw - 1] = mp_obj_str_get_str(kw->table[i].key);
            vals[max + n_kw - 1] = kw->table[i].value;
        }
    }
    int slot[LLM_BIND_MAX_PARAMS];
    llm_bind_error e;
    llm_check(llm_bind_match(meth, n_pos, names, n_kw, slot, &e), &e);
    /* a closed model says so first; then what may run user code (iterating,
     * __float__, __bool__), which may close it; the open check again; then
     * the ids against the engine */
    llm_ready(args[0]);
    llm_bind_arg a[LLM_BIND_MAX_PARAMS] = {{0}};
    mp_obj_t seq[LLM_BIND_MAX_PARAMS];
    uint8_t *bits[LLM_BIND_MAX_PARAMS] = {NULL, NULL, NULL};
    for (int j = 0; j < meth->n_params; j++) {
        const llm_bind_param *p = &meth->params[j];
        mp_obj_t o = slot[j] < 0 ? MP_OBJ_NULL : vals[slot[j]];
        if (p->or_none && o == mp_const_none) {
            o = MP_OBJ_NULL;
        }
        a[j].given = o != MP_OBJ_NULL;
        if (!a[j].given) {
            continue;
        } else if (p->kind == LLM_BIND_P_FLOAT) {
            a[j].f = (double)mp_obj_get_float(o);
        } else if (p->kind == LLM_BIND_P_BOOL) {
            a[j].on = mp_obj_is_true(o);
        } else if (p->kind == LLM_BIND_P_BITS) {
            /* copied: a scheduled callback (mp_handle_pending below) could
             * resize a bytearray before the engine reads it */
            mp_buffer_info_t buf;
            if (!mp_get_buffer(o, &buf, MP_BUFFER_READ)) {
                llm_bind_not_bits(p->what, mp_obj_get_type_str(o), &e);
                llm_raise(&e);
            }
            bits[j] = m_new(uint8_t, buf.len + 1);
            memcpy(bits[j], buf.buf, buf.len);
            a[j].bits = bits[j];
            a[j].n = buf.len;
        } else if (p->kind == LLM_BIND_P_TOKENS) {
            const bool array = mp_obj_is_type(o, &mp_type_list) || mp_obj_is_type(o, &mp_type_tuple);
            seq[j] = array ? o : llm_token_list(o, p->what);
        } else {
            a[j].i = llm_int(o, p->what, p->kind == LLM_BIND_P_U64 ? 64 : 63);
        }
    }
    llm_model_obj_t *self = llm_ready(args[0]);
    int32_t *ids[LLM_BIND_MAX_PARAMS] = {NULL, NULL, NULL};
    for (int j = 0; j < meth->n_params; j++) {
        if (a[j].given && meth->params[j].kind == LLM_BIND_P_TOKENS) {
            mp_obj_t *items;
            mp_obj_get_array(seq[j], &a[j].n, &items);
            llm_check(llm_bind_tokens(&self->m, &meth->params[j], a[j].n, &e), &e);
            a[j].ids = ids[j] = m_new(int32_t, a[j].n + 1);
            for (size_t i = 0; i < a[j].n; i++) {
                llm_check(llm_bind_token(&self->m, &meth->params[j],
                    llm_int(items[i], "a token id", 63), &ids[j][i], &e), &e);
            }
        }
    }
    mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS); /* Ctrl-C between tokens */
    llm_bind_out out;
    /* held back: the unix port's Ctrl-C would jump out of the engine half-way */
    const int held = mpllm_interrupts_hold();
    llm_bind_kind kind = llm_bind_call(&self->m, id, a, &out, &e);
    for (int j = 0; j < LLM_BIND_MAX_PARAMS; j++) {
        m_del(int32_t, ids[j], a[j].n + 1);
        m_del(uint8_t, bits[j], a[j].n + 1);
    }
    llm_interrupts_allow(held);
    llm_check(kind, &e);
    return llm_result(self, id, &out);
}

mp_obj_t llm_selftest_dict(const llm_bind_selftest *t, mp_obj_t lines) {
    llm_builder b = {{mp_const_none}};
    const llm_bind_sink sink = {llm_put, &b};
    llm_bind_selftest_result(t, &sink);
    mp_obj_dict_store(b.at[0], MP_OBJ_NEW_QSTR(MP_QSTR_lines), lines);
    return b.at[0];
}

mp_obj_t llm_plan_dict(const llm_bind_plan_out *out) {
    llm_builder b = {{mp_const_none}};
    const llm_bind_sink sink = {llm_put, &b};
    llm_bind_plan_result(out, &sink);
    return b.at[0];
}
