/*
 * MicroPython `_llm`: the engine (llm.h) behind the same Python API as the
 * CPython `_llm` (native/python/mod_llm.c; documented once in
 * firmware/modules/_llm.pyi).
 *
 * What is specific to MicroPython:
 *   - One model is open at a time and it stays open across calls: the open
 *     model is a root pointer, so `llm.story()` after `llm.story()` does not
 *     map and stage the image again. Model() naming the same source returns
 *     the open model; another source closes it first (its memory, outside
 *     the GC heap, could not hold two on the board).
 *   - Soft reset frees it: the object has a finaliser, which gc_sweep_all()
 *     runs on soft reset (and the unix port at exit).
 *   - Ctrl-C: a pending KeyboardInterrupt is raised before each engine call,
 *     i.e. between tokens, never inside one.
 *   - Model() with no argument opens the board's `model` partition; a str
 *     names a partition (board) or a file (unix); a bytes-like object is an
 *     image in RAM.
 */
#include <stdio.h>
#include <string.h>

#include "py/mphal.h"
#include "py/objint.h"
#include "py/objstr.h"
#include "py/runtime.h"

#include "llm.h"
#include "llm_bind.h"
#include "llm_names.h"
#include "modllm_platform.h"
#include "selftest.h"

typedef struct _llm_model_obj_t {
    mp_obj_base_t base;
    llm_engine *engine;
    mpllm_port_t port;   /* the engine points at it: lives as long as the object */
    mpllm_map_t map;     /* valid while mapped */
    bool mapped;
    bool port_ready;
    mp_obj_t source;     /* str it was opened from, or the buffer object kept alive */
    void *copy;          /* aligned copy of an unaligned buffer (port memory) */
} llm_model_obj_t;

/* _llm.Error, a RuntimeError like the CPython binding's. */
MP_DEFINE_CONST_OBJ_TYPE(
    llm_type_Error,
    MP_QSTR_Error,
    MP_TYPE_FLAG_NONE,
    make_new, mp_obj_exception_make_new,
    print, mp_obj_exception_print,
    attr, mp_obj_exception_attr,
    parent, &mp_type_RuntimeError
    );

extern const mp_obj_type_t llm_type_Model;

/* ---- errors ------------------------------------------------------------ */

/* The one place a decision of llm_bind.h becomes a Python exception. */
static MP_NORETURN void llm_raise_bind(const llm_bind_error *e) {
    const mp_obj_type_t *type = &llm_type_Error;
    switch (e->kind) {
        case LLM_BIND_TYPE_ERROR:
            type = &mp_type_TypeError;
            break;
        case LLM_BIND_VALUE_ERROR:
            type = &mp_type_ValueError;
            break;
        case LLM_BIND_MEMORY_ERROR:
            type = &mp_type_MemoryError;
            break;
        case LLM_BIND_INTERRUPT:
            /* the poll saw the pending KeyboardInterrupt: raise it now */
            mpllm_interrupts_allow();
            mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
            mp_raise_type(&mp_type_KeyboardInterrupt);
        default:
            break;
    }
    mp_raise_msg_varg(type, MP_ERROR_TEXT("%s"), e->message);
}

static MP_NORETURN void llm_raise(const llm_error *err) {
    llm_bind_error e;
    llm_bind_status(err, &e);
    llm_raise_bind(&e);
}

static void llm_check(llm_bind_kind kind, const llm_bind_error *e) {
    if (kind != LLM_BIND_OK) {
        llm_raise_bind(e);
    }
}

static llm_model_obj_t *llm_ready(mp_obj_t self_in) {
    llm_model_obj_t *self = MP_OBJ_TO_PTR(self_in);
    if (self->engine == NULL) {
        llm_bind_error e;
        llm_bind_closed(&e);
        llm_raise_bind(&e);
    }
    return self;
}

/* An int argument for the shared rules: TypeError for anything else (bool
 * included). A big int gives its low 64 bits when it is non-negative and
 * fits in `bits` (63: an int64, 64: a u64 such as a seed); otherwise, and
 * for a negative big int (below every limit here), overflow. */
static llm_bind_int llm_int_bits(mp_obj_t o, const char *what, int bits) {
    if (!mp_obj_is_int(o) || mp_obj_is_bool(o)) {
        mp_raise_msg_varg(&mp_type_TypeError, MP_ERROR_TEXT("%s must be an int, not %s"), what,
            mp_obj_get_type_str(o));
    }
    llm_bind_int v = {0, 0};
    uint8_t b[8];
    if (mp_obj_is_small_int(o)) {
        v.value = MP_OBJ_SMALL_INT_VALUE(o);
    } else if (mp_obj_int_sign(o) < 0) {
        v.overflow = -1;
    } else if (!mp_obj_int_to_bytes_impl(o, false, sizeof(b), b) || (bits == 63 && (b[7] & 0x80u))) {
        v.overflow = 1;
    } else {
        for (int i = 7; i >= 0; i--) {
            v.value = (int64_t)(((uint64_t)v.value << 8) | b[i]);
        }
    }
    if (bits == 64 && v.value < 0 && mp_obj_is_small_int(o)) {
        v.overflow = -1; /* a negative seed */
    }
    return v;
}

static llm_bind_int llm_int_arg(mp_obj_t o, const char *what) {
    return llm_int_bits(o, what, 63);
}

/* Between calls: raise a pending KeyboardInterrupt (Ctrl-C) now. */
static void llm_check_interrupt(void) {
    mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
}

/* Polled between a long prefill's passes: a pending Ctrl-C stops it (the
 * engine then undoes it). */
static int llm_poll(void *ctx) {
    (void)ctx;
    return MP_STATE_THREAD(mp_pending_exception) != MP_OBJ_NULL || mpllm_interrupt_pending();
}

/* ---- lifetime ---------------------------------------------------------- */

static void llm_release(llm_model_obj_t *self) {
    if (self->engine != NULL) {
        llm_close(self->engine);
        self->engine = NULL;
    }
    if (self->copy != NULL) {
        llm_port *port = mpllm_port_get(&self->port);
        port->free(port->ctx, self->copy);
        self->copy = NULL;
    }
    if (self->mapped) {
        mpllm_unmap(&self->map);
        self->mapped = false;
    }
    if (self->port_ready) {
        mpllm_port_deinit(&self->port);
        self->port_ready = false;
    }
    self->source = mp_const_none;
    if (MP_STATE_VM(llm_open_model) == self) {
        MP_STATE_VM(llm_open_model) = NULL;
    }
}

static bool llm_same_source(mp_obj_t a, mp_obj_t b) {
    return mp_obj_is_str(a) && mp_obj_is_str(b) && mp_obj_equal(a, b);
}

static mp_obj_t llm_model_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw,
    const mp_obj_t *all_args) {
    enum { ARG_image, ARG_plain, ARG_fast };
    static const mp_arg_t allowed_args[] = {
        { MP_QSTR_image, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_plain, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_fast, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
    };
    mp_arg_val_t args[MP_ARRAY_SIZE(allowed_args)];
    mp_arg_parse_all_kw_array(n_args, n_kw, all_args, MP_ARRAY_SIZE(allowed_args),
        allowed_args, args);
    mp_obj_t image = args[ARG_image].u_obj;
    const int plain = args[ARG_plain].u_obj != mp_const_none && mp_obj_is_true(args[ARG_plain].u_obj);
    const int fast = args[ARG_fast].u_obj != mp_const_none && mp_obj_is_true(args[ARG_fast].u_obj);
    llm_bind_error be;
    llm_check(llm_bind_modes(plain, fast, &be), &be);
    const char *name = NULL;
    mp_buffer_info_t buf = {0};

    if (image == mp_const_none) {
        #ifdef MPLLM_DEFAULT_SOURCE
        image = mp_obj_new_str(MPLLM_DEFAULT_SOURCE, strlen(MPLLM_DEFAULT_SOURCE));
        #else
        mp_raise_TypeError(MP_ERROR_TEXT("Model() needs an image: a path or a buffer"));
        #endif
    }
    if (mp_obj_is_str(image)) {
        name = mp_obj_str_get_str(image);
    } else {
        mp_get_buffer_raise(image, &buf, MP_BUFFER_READ);
    }

    llm_model_obj_t *open = MP_STATE_VM(llm_open_model);
    if (open != NULL && open->engine != NULL) {
        if (name != NULL && llm_same_source(open->source, image)) {
            /* the shared model keeps its modes unless plain= / fast= say
             * otherwise (a change of fast mode starts the context over) */
            if (args[ARG_fast].u_obj != mp_const_none && fast != llm_fast(open->engine)) {
                llm_error err;
                if (fast && llm_fast_fits(open->engine, &err) != LLM_OK) {
                    llm_raise(&err); /* refused before anything changed */
                }
                llm_reset(open->engine);
                if (fast) {
                    llm_set_plain(open->engine, 0);
                }
                if (llm_set_fast(open->engine, fast, &err) != LLM_OK) {
                    llm_raise(&err);
                }
            }
            if (args[ARG_plain].u_obj != mp_const_none) {
                llm_check(llm_bind_set_plain(open->engine, plain, &be), &be);
                llm_set_plain(open->engine, plain);
            }
            return MP_OBJ_FROM_PTR(open);
        }
    }

    llm_model_obj_t *self = mp_obj_malloc_with_finaliser(llm_model_obj_t, type);
    self->engine = NULL;
    self->mapped = false;
    self->port_ready = false;
    self->source = mp_const_none;
    self->copy = NULL;

    llm_error err;
    if (mpllm_port_init(&self->port, &err) != LLM_OK) {
        llm_raise(&err);
    }
    self->port_ready = true;
    llm_port *port = mpllm_port_get(&self->port);

    const uint8_t *data;
    size_t len;
    if (name != NULL) {
        int sys_errno = 0;
        if (mpllm_map(name, &self->map, &sys_errno, &err) != LLM_OK) {
            llm_release(self);
            if (sys_errno != 0) {
                mp_raise_OSError_with_filename(sys_errno, name);
            }
            llm_raise(&err);
        }
        self->mapped = true;
        data = mpllm_map_data(&self->map);
        len = mpllm_map_len(&self->map);
    } else {
        data = buf.buf;
        len = buf.len;
        if (llm_bind_must_copy(data, len, mp_obj_is_type(image, &mp_type_bytes))) {
            llm_region placed;
            self->copy = port->alloc(port->ctx, len > 0 ? len : 16u, LLM_REGION_BULK, &placed);
            if (self->copy == NULL) {
                llm_release(self);
                err.status = LLM_E_NOMEM;
                snprintf(err.message, sizeof(err.message),
                    "no memory for an aligned copy of the image (%lu bytes)", (unsigned long)len);
                llm_raise(&err);
            }
            if (len > 0) {
                memcpy(self->copy, data, len);
            }
            data = self->copy;
        }
    }
    /* a path (to compare with the next Model() call), or the caller's
     * buffer used in place (kept alive); not a buffer we copied: the image
     * is then held once, in the copy */
    self->source = self->copy == NULL ? image : mp_const_none;
    if (open != NULL && open->engine != NULL) {
        /* the open model is given up only for an image that will open: a
         * bad one leaves it as it was (the board has memory for one model) */
        if (llm_check_image(data, len, &err) != LLM_OK) {
            llm_release(self);
            llm_raise(&err);
        }
        llm_release(open);
    }

    llm_engine *engine = NULL;
    mpllm_interrupts_hold();
    llm_status st = llm_open(&engine, data, len, port, &err);
    mpllm_interrupts_allow();
    if (st != LLM_OK) {
        llm_release(self);
        llm_raise(&err);
    }
    llm_set_plain(engine, plain);
    llm_set_interrupt(engine, llm_poll, NULL);
    if (fast) {
        llm_error ferr;
        if (llm_set_fast(engine, 1, &ferr) != LLM_OK) {
            llm_close(engine);
            llm_release(self);
            llm_raise(&ferr);
        }
    }
    self->engine = engine;
    MP_STATE_VM(llm_open_model) = self;
    return MP_OBJ_FROM_PTR(self);
}

static mp_obj_t llm_model_close(mp_obj_t self_in) {
    llm_release(MP_OBJ_TO_PTR(self_in));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_close_obj, llm_model_close);

static mp_obj_t llm_model_enter(mp_obj_t self_in) {
    llm_ready(self_in);
    return self_in;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_enter_obj, llm_model_enter);

static mp_obj_t llm_model_exit(size_t n_args, const mp_obj_t *args) {
    (void)n_args;
    return llm_model_close(args[0]);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(llm_model_exit_obj, 4, 4, llm_model_exit);

/* ---- methods ----------------------------------------------------------- */

static mp_obj_t llm_model_reset(mp_obj_t self_in) {
    llm_reset(llm_ready(self_in)->engine);
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_reset_obj, llm_model_reset);

static mp_obj_t llm_model_pos(mp_obj_t self_in) {
    return mp_obj_new_int_from_uint(llm_pos(llm_ready(self_in)->engine));
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_pos_obj, llm_model_pos);

static mp_obj_t llm_model_rewind(mp_obj_t self_in, mp_obj_t pos_in) {
    llm_engine *e = llm_ready(self_in)->engine;
    uint32_t pos;
    llm_bind_error be;
    llm_check(llm_bind_rewind(e, llm_int_arg(pos_in, "rewind() position"), &pos, &be), &be);
    llm_error err;
    if (llm_rewind(e, pos, &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_rewind_obj, llm_model_rewind);


static void llm_store_fields(mp_obj_t d, const llm_bind_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(qstr_from_str(f[i].name)),
            mp_obj_new_int_from_ull(f[i].value));
    }
}

static mp_obj_t llm_model_config(mp_obj_t self_in) {
    llm_engine *e = llm_ready(self_in)->engine;
    const llm_config *c = llm_get_config(e);
    mp_obj_t d = mp_obj_new_dict(LLM_BIND_CONFIG_INTS + 2);
    llm_bind_field f[LLM_BIND_CONFIG_INTS];
    llm_bind_config(e, f);
    llm_store_fields(d, f, LLM_BIND_CONFIG_INTS);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_rope_theta), mp_obj_new_float(c->rope_theta));
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_tied_head), mp_obj_new_bool(c->flags & 1u));
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_config_obj, llm_model_config);

static mp_obj_t llm_model_sampler(size_t n_args, const mp_obj_t *pos_args, mp_map_t *kw_args) {
    enum { ARG_temperature, ARG_top_k, ARG_seed };
    static const mp_arg_t allowed_args[] = {
        { MP_QSTR_temperature, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_top_k, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_seed, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
    };
    mp_arg_val_t args[MP_ARRAY_SIZE(allowed_args)];
    mp_arg_parse_all(n_args - 1, pos_args + 1, kw_args, MP_ARRAY_SIZE(allowed_args),
        allowed_args, args);
    llm_ready(pos_args[0]);
    mp_float_t t = 0;
    if (args[ARG_temperature].u_obj != mp_const_none) {
        t = mp_obj_get_float(args[ARG_temperature].u_obj);
    }
    llm_bind_int top_k = {0, 0}, seed = {0, 0};
    if (args[ARG_top_k].u_obj != mp_const_none) {
        top_k = llm_int_arg(args[ARG_top_k].u_obj, "top_k");
    }
    if (args[ARG_seed].u_obj != mp_const_none) {
        seed = llm_int_bits(args[ARG_seed].u_obj, "seed", 64);
    }
    /* __float__ above is user code that may have closed the model */
    llm_model_obj_t *self = llm_ready(pos_args[0]);
    llm_sampler_options opt;
    llm_bind_error be;
    llm_check(llm_bind_sampler(self->engine, (double)t, top_k, seed, &opt, &be), &be);
    llm_error err;
    if (llm_set_sampler(self->engine, &opt, &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_KW(llm_model_sampler_obj, 1, llm_model_sampler);

/* A token argument: an int in the embedding's range, else TypeError/ValueError. */
static int32_t llm_token_arg(llm_model_obj_t *self, mp_obj_t o) {
    int32_t id;
    llm_bind_error be;
    llm_check(llm_bind_token(self->engine, llm_int_arg(o, "a token id"), &id, &be), &be);
    return id;
}

/* A sequence of token ids as a fresh array of *n (m_del it). Iterating runs
 * user code, which may close the model: the open check is repeated after
 * it, before the engine's config is read. */
static int32_t *llm_tokens_arg(mp_obj_t self_in, mp_obj_t tokens, size_t min_n, size_t max_n,
    size_t *n_out,
    const char *name) {
    size_t n;
    mp_obj_t *items;
    mp_obj_t seq = tokens;
    if (!mp_obj_is_type(tokens, &mp_type_list) && !mp_obj_is_type(tokens, &mp_type_tuple)) {
        seq = mp_obj_new_list(0, NULL);
        mp_obj_t iter = mp_getiter(tokens, NULL);
        mp_obj_t item;
        while ((item = mp_iternext(iter)) != MP_OBJ_STOP_ITERATION) {
            mp_obj_list_append(seq, item);
        }
    }
    llm_model_obj_t *self = llm_ready(self_in);
    mp_obj_get_array(seq, &n, &items);
    llm_bind_error be;
    llm_check(llm_bind_count(name, n, min_n, max_n, &be), &be);
    int32_t *ids = m_new(int32_t, n > 0 ? n : 1);
    for (size_t i = 0; i < n; i++) {
        ids[i] = llm_token_arg(self, items[i]);
    }
    *n_out = n;
    return ids;
}

/* Engine calls that compute run with Ctrl-C held back (on the unix port
 * it would otherwise jump out of the engine half-way): a long prefill polls
 * it between passes and undoes itself; everything else is short. */
static mp_obj_t llm_model_prefill(mp_obj_t self_in, mp_obj_t tokens) {
    llm_ready(self_in);
    size_t n;
    int32_t *ids = llm_tokens_arg(self_in, tokens, 1, UINT32_MAX / 2u, &n, "prefill()");
    llm_model_obj_t *self = llm_ready(self_in);
    llm_check_interrupt();
    llm_error err;
    int32_t next = 0;
    mpllm_interrupts_hold();
    llm_status st = llm_prefill(self->engine, ids, (uint32_t)n, &next, &err);
    mpllm_interrupts_allow();
    m_del(int32_t, ids, n);
    if (st != LLM_OK) {
        llm_raise(&err);
    }
    return MP_OBJ_NEW_SMALL_INT(next);
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_prefill_obj, llm_model_prefill);

static mp_obj_t llm_model_draft(mp_obj_t self_in, mp_obj_t context, mp_obj_t max_len_in) {
    llm_ready(self_in);
    uint32_t want;
    llm_bind_error be;
    llm_check(llm_bind_draft_len(llm_int_arg(max_len_in, "draft() max_len"), &want, &be), &be);
    size_t n;
    int32_t *ids = llm_tokens_arg(self_in, context, 0, UINT32_MAX / 2u, &n, "draft()");
    llm_model_obj_t *self = llm_ready(self_in);
    int32_t out[LLM_BIND_MAX_DRAFT];
    uint32_t got = llm_draft(self->engine, ids, (uint32_t)n, want, out);
    m_del(int32_t, ids, n > 0 ? n : 1);
    mp_obj_t list = mp_obj_new_list(got, NULL);
    for (uint32_t i = 0; i < got; i++) {
        mp_obj_list_store(list, MP_OBJ_NEW_SMALL_INT(i), MP_OBJ_NEW_SMALL_INT(out[i]));
    }
    return list;
}
static MP_DEFINE_CONST_FUN_OBJ_3(llm_model_draft_obj, llm_model_draft);

static mp_obj_t llm_model_verify(mp_obj_t self_in, mp_obj_t tokens) {
    llm_ready(self_in);
    size_t n;
    int32_t *ids = llm_tokens_arg(self_in, tokens, 1, LLM_VERIFY_MAX, &n, "verify()");
    llm_model_obj_t *self = llm_ready(self_in);
    llm_check_interrupt();
    llm_error err;
    int32_t next[LLM_VERIFY_MAX];
    mpllm_interrupts_hold();
    llm_status st = llm_verify(self->engine, ids, (uint32_t)n, next, &err);
    mpllm_interrupts_allow();
    m_del(int32_t, ids, n);
    if (st != LLM_OK) {
        llm_raise(&err);
    }
    mp_obj_t out = mp_obj_new_list(n, NULL);
    for (size_t i = 0; i < n; i++) {
        mp_obj_list_store(out, MP_OBJ_NEW_SMALL_INT(i), MP_OBJ_NEW_SMALL_INT(next[i]));
    }
    return out;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_verify_obj, llm_model_verify);

static mp_obj_t llm_model_step(mp_obj_t self_in, mp_obj_t token) {
    llm_model_obj_t *self = llm_ready(self_in);
    int32_t id = llm_token_arg(self, token);
    llm_check_interrupt();
    llm_error err;
    int32_t next = 0;
    mpllm_interrupts_hold();
    llm_status st = llm_step(self->engine, id, &next, &err);
    mpllm_interrupts_allow();
    if (st != LLM_OK) {
        llm_raise(&err);
    }
    return MP_OBJ_NEW_SMALL_INT(next);
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_step_obj, llm_model_step);

static mp_obj_t llm_model_logits(mp_obj_t self_in) {
    llm_model_obj_t *self = llm_ready(self_in);
    const float *l = llm_logits(self->engine);
    if (l == NULL) {
        llm_error err = {LLM_E_STATE, "no logits yet: call prefill() or step() first"};
        llm_raise(&err);
    }
    /* float32 little-endian, like the CPython binding: both targets are LE */
    return mp_obj_new_bytes((const byte *)l, (size_t)llm_get_config(self->engine)->vocab_out * 4u);
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_logits_obj, llm_model_logits);

/* tokenizer() is a _llm.Section: the image's tokenizer section read in place
 * (no heap copy: 368 KB on the release model). It holds the model object and
 * asks it for the bytes at every access, so once the model is closed an
 * access is an Error, never a read of unmapped memory. Indexing gives ints,
 * slicing bytes, and the buffer protocol a read-only view (which, like any
 * MicroPython memoryview, must not be kept past close()). */
typedef struct _llm_section_obj_t {
    mp_obj_base_t base;
    mp_obj_t model;
} llm_section_obj_t;

static const uint8_t *llm_section_data(mp_obj_t self_in, size_t *len) {
    llm_section_obj_t *self = MP_OBJ_TO_PTR(self_in);
    return llm_tokenizer(llm_ready(self->model)->engine, len);
}

static mp_obj_t llm_section_subscr(mp_obj_t self_in, mp_obj_t index, mp_obj_t value) {
    if (value != MP_OBJ_SENTINEL) {
        return MP_OBJ_NULL; /* read-only: store and delete are TypeErrors */
    }
    size_t len;
    const uint8_t *p = llm_section_data(self_in, &len);
    if (mp_obj_is_type(index, &mp_type_slice)) {
        mp_bound_slice_t b;
        if (!mp_seq_get_fast_slice_indexes(len, index, &b)) {
            mp_raise_NotImplementedError(MP_ERROR_TEXT("slice step"));
        }
        return mp_obj_new_bytes(p + b.start, b.stop > b.start ? (size_t)(b.stop - b.start) : 0);
    }
    return MP_OBJ_NEW_SMALL_INT(p[mp_get_index(mp_obj_get_type(self_in), len, index, false)]);
}

static mp_obj_t llm_section_unary_op(mp_unary_op_t op, mp_obj_t self_in) {
    if (op != MP_UNARY_OP_LEN) {
        return MP_OBJ_NULL;
    }
    size_t len;
    llm_section_data(self_in, &len);
    return MP_OBJ_NEW_SMALL_INT(len);
}

static mp_int_t llm_section_get_buffer(mp_obj_t self_in, mp_buffer_info_t *bufinfo,
    mp_uint_t flags) {
    if (flags & MP_BUFFER_WRITE) {
        return 1;
    }
    size_t len;
    bufinfo->buf = (void *)llm_section_data(self_in, &len);
    bufinfo->len = len;
    bufinfo->typecode = 'B';
    return 0;
}

MP_DEFINE_CONST_OBJ_TYPE(
    llm_type_Section,
    MP_QSTR_Section,
    MP_TYPE_FLAG_NONE,
    subscr, llm_section_subscr,
    unary_op, llm_section_unary_op,
    buffer, llm_section_get_buffer
    );

static mp_obj_t llm_model_tokenizer(mp_obj_t self_in) {
    llm_ready(self_in);
    llm_section_obj_t *o = mp_obj_malloc(llm_section_obj_t, &llm_type_Section);
    o->model = self_in;
    return MP_OBJ_FROM_PTR(o);
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_tokenizer_obj, llm_model_tokenizer);

static mp_obj_t llm_model_stats(mp_obj_t self_in) {
    llm_stats s;
    llm_get_stats(llm_ready(self_in)->engine, &s);
    mp_obj_t d = mp_obj_new_dict(LLM_BIND_STATS_INTS + 4);
    llm_bind_field f[LLM_BIND_STATS_INTS];
    llm_bind_stats(&s, f);
    llm_store_fields(d, f, LLM_BIND_STATS_INTS);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_ttft_ms), mp_obj_new_float((mp_float_t)llm_bind_ttft_ms(&s)));
    mp_obj_t ms = mp_obj_new_dict(LLM_STAGE_COUNT);
    for (int i = 0; i < LLM_STAGE_COUNT; i++) {
        const char *name = llm_stage_name((llm_stage)i);
        mp_obj_dict_store(ms, mp_obj_new_str(name, strlen(name)),
            mp_obj_new_float((mp_float_t)llm_bind_stage_ms(&s, (llm_stage)i)));
    }
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_stage_ms), ms);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_total_ms), mp_obj_new_float((mp_float_t)llm_bind_total_ms(&s)));
    mp_obj_t bytes = mp_obj_new_dict(LLM_REGION_COUNT);
    for (int r = 0; r < LLM_REGION_COUNT; r++) {
        const char *name = llm_region_name((llm_region)r);
        mp_obj_dict_store(bytes, mp_obj_new_str(name, strlen(name)),
            mp_obj_new_int_from_ull(s.bytes[r]));
    }
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_bytes), bytes);
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_stats_obj, llm_model_stats);

/* on's __bool__ is user code (it may close the model): it runs first, and
 * the engine pointer is read after it. */
static mp_obj_t llm_model_set_fast(mp_obj_t self_in, mp_obj_t on_in) {
    const int on = mp_obj_is_true(on_in);
    llm_error err;
    if (llm_set_fast(llm_ready(self_in)->engine, on, &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_set_fast_obj, llm_model_set_fast);

static mp_obj_t llm_model_fast(mp_obj_t self_in) {
    return mp_obj_new_bool(llm_fast(llm_ready(self_in)->engine));
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_fast_obj, llm_model_fast);

static mp_obj_t llm_model_set_plain(mp_obj_t self_in, mp_obj_t on_in) {
    const int on = mp_obj_is_true(on_in);
    llm_engine *e = llm_ready(self_in)->engine;
    llm_bind_error be;
    llm_check(llm_bind_set_plain(e, on, &be), &be);
    llm_set_plain(e, on);
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_set_plain_obj, llm_model_set_plain);

static mp_obj_t llm_model_plain(mp_obj_t self_in) {
    return mp_obj_new_bool(llm_plain(llm_ready(self_in)->engine));
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_plain_obj, llm_model_plain);

static mp_obj_t llm_model_memory(mp_obj_t self_in) {
    llm_engine *e = llm_ready(self_in)->engine;
    uint32_t n = llm_placement_count(e);
    mp_obj_t list = mp_obj_new_list(0, NULL);
    for (uint32_t i = 0; i < n; i++) {
        const llm_placement *p = llm_placement_at(e, i);
        const char *region = llm_region_name(p->region);
        mp_obj_t t[3] = {
            mp_obj_new_str(p->name, strlen(p->name)),
            mp_obj_new_str(region, strlen(region)),
            mp_obj_new_int_from_uint(p->bytes),
        };
        mp_obj_list_append(list, mp_obj_new_tuple(3, t));
    }
    return list;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_memory_obj, llm_model_memory);

static const mp_rom_map_elem_t llm_model_locals_dict_table[] = {
    { MP_ROM_QSTR(MP_QSTR_config), MP_ROM_PTR(&llm_model_config_obj) },
    { MP_ROM_QSTR(MP_QSTR_reset), MP_ROM_PTR(&llm_model_reset_obj) },
    { MP_ROM_QSTR(MP_QSTR_sampler), MP_ROM_PTR(&llm_model_sampler_obj) },
    { MP_ROM_QSTR(MP_QSTR_prefill), MP_ROM_PTR(&llm_model_prefill_obj) },
    { MP_ROM_QSTR(MP_QSTR_step), MP_ROM_PTR(&llm_model_step_obj) },
    { MP_ROM_QSTR(MP_QSTR_verify), MP_ROM_PTR(&llm_model_verify_obj) },
    { MP_ROM_QSTR(MP_QSTR_draft), MP_ROM_PTR(&llm_model_draft_obj) },
    { MP_ROM_QSTR(MP_QSTR_logits), MP_ROM_PTR(&llm_model_logits_obj) },
    { MP_ROM_QSTR(MP_QSTR_tokenizer), MP_ROM_PTR(&llm_model_tokenizer_obj) },
    { MP_ROM_QSTR(MP_QSTR_pos), MP_ROM_PTR(&llm_model_pos_obj) },
    { MP_ROM_QSTR(MP_QSTR_rewind), MP_ROM_PTR(&llm_model_rewind_obj) },
    { MP_ROM_QSTR(MP_QSTR_stats), MP_ROM_PTR(&llm_model_stats_obj) },
    { MP_ROM_QSTR(MP_QSTR_memory), MP_ROM_PTR(&llm_model_memory_obj) },
    { MP_ROM_QSTR(MP_QSTR_set_plain), MP_ROM_PTR(&llm_model_set_plain_obj) },
    { MP_ROM_QSTR(MP_QSTR_plain), MP_ROM_PTR(&llm_model_plain_obj) },
    { MP_ROM_QSTR(MP_QSTR_set_fast), MP_ROM_PTR(&llm_model_set_fast_obj) },
    { MP_ROM_QSTR(MP_QSTR_fast), MP_ROM_PTR(&llm_model_fast_obj) },
    { MP_ROM_QSTR(MP_QSTR_close), MP_ROM_PTR(&llm_model_close_obj) },
    { MP_ROM_QSTR(MP_QSTR___enter__), MP_ROM_PTR(&llm_model_enter_obj) },
    { MP_ROM_QSTR(MP_QSTR___exit__), MP_ROM_PTR(&llm_model_exit_obj) },
    { MP_ROM_QSTR(MP_QSTR___del__), MP_ROM_PTR(&llm_model_close_obj) },
};
static MP_DEFINE_CONST_DICT(llm_model_locals_dict, llm_model_locals_dict_table);

MP_DEFINE_CONST_OBJ_TYPE(
    llm_type_Model,
    MP_QSTR_Model,
    MP_TYPE_FLAG_NONE,
    make_new, llm_model_make_new,
    locals_dict, &llm_model_locals_dict
    );

/* ---- module ------------------------------------------------------------ */

static mp_obj_t llm_build_info_fn(void) {
    const char *s = llm_build_info();
    return mp_obj_new_str(s, strlen(s));
}
static MP_DEFINE_CONST_FUN_OBJ_0(llm_build_info_obj, llm_build_info_fn);

typedef struct {
    mp_obj_t lines;
    llm_bind_selftest sum;
} llm_selftest_acc;

static void llm_selftest_line(void *user, const char *line) {
    llm_selftest_acc *acc = user;
    llm_bind_selftest_line(&acc->sum, line);
    mp_obj_list_append(acc->lines, mp_obj_new_str(line, strlen(line)));
}

static mp_obj_t llm_selftest_fn(void) {
    llm_selftest_acc acc = {mp_obj_new_list(0, NULL), {{0}, 0, 0, 0, 0}};
    llm_selftest_run(llm_selftest_line, &acc);
    const llm_bind_selftest *t = &acc.sum;
    mp_printf(&mp_plat_print, "selftest (kernels=%s): %u kernel checks passed, %u failed; "
        "%u probes, %u differ from the host model\n", t->kernels, (unsigned)t->passed,
        (unsigned)t->failures, (unsigned)t->probes, (unsigned)t->probe_differences);
    mp_obj_t d = mp_obj_new_dict(7);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_kernels), mp_obj_new_str(t->kernels, strlen(t->kernels)));
    const llm_bind_field f[] = {
        {"passed", t->passed}, {"failures", t->failures}, {"probes", t->probes},
        {"probe_differences", t->probe_differences},
    };
    llm_store_fields(d, f, MP_ARRAY_SIZE(f));
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_ok), mp_obj_new_bool(t->failures == 0));
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_lines), acc.lines);
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_0(llm_selftest_obj, llm_selftest_fn);

static const MP_DEFINE_STR_OBJ(llm_version_obj, LLM_VERSION);

static const mp_rom_map_elem_t llm_module_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR__llm) },
    { MP_ROM_QSTR(MP_QSTR_Model), MP_ROM_PTR(&llm_type_Model) },
    { MP_ROM_QSTR(MP_QSTR_Error), MP_ROM_PTR(&llm_type_Error) },
    { MP_ROM_QSTR(MP_QSTR_build_info), MP_ROM_PTR(&llm_build_info_obj) },
    { MP_ROM_QSTR(MP_QSTR_selftest), MP_ROM_PTR(&llm_selftest_obj) },
    { MP_ROM_QSTR(MP_QSTR___version__), MP_ROM_PTR(&llm_version_obj) },
    { MP_ROM_QSTR(MP_QSTR_MAX_TOP_K), MP_ROM_INT(LLM_BIND_MAX_TOP_K) },
};
static MP_DEFINE_CONST_DICT(llm_module_globals, llm_module_globals_table);

const mp_obj_module_t llm_user_cmodule = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&llm_module_globals,
};

MP_REGISTER_MODULE(MP_QSTR__llm, llm_user_cmodule);
MP_REGISTER_ROOT_POINTER(struct _llm_model_obj_t *llm_open_model);
