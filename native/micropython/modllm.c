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

#include "image_format.h"
#include "llm.h"
#include "llm_names.h"
#include "modllm_platform.h"

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

/* The one place an engine status becomes a Python exception. */
static MP_NORETURN void llm_raise(const llm_error *err) {
    mp_raise_msg_varg(&llm_type_Error, MP_ERROR_TEXT("%s: %s"),
        llm_status_name(err->status), err->message);
}

static MP_NORETURN void llm_raise_state(const char *message) {
    llm_error err;
    err.status = LLM_E_STATE;
    strncpy(err.message, message, sizeof(err.message) - 1);
    err.message[sizeof(err.message) - 1] = '\0';
    llm_raise(&err);
}

static llm_model_obj_t *llm_ready(mp_obj_t self_in) {
    llm_model_obj_t *self = MP_OBJ_TO_PTR(self_in);
    if (self->engine == NULL) {
        llm_raise_state("the model is closed");
    }
    return self;
}

/* Between tokens: raise a pending KeyboardInterrupt (Ctrl-C) now. */
static void llm_check_interrupt(void) {
    mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
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
    if (plain && fast) {
        mp_raise_ValueError(MP_ERROR_TEXT("plain (the exact reference) and fast (lossy) exclude "
            "each other"));
    }
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
                llm_reset(open->engine);
                if (fast) {
                    llm_set_plain(open->engine, 0);
                }
                if (llm_set_fast(open->engine, fast, &err) != LLM_OK) {
                    llm_raise(&err);
                }
            }
            if (args[ARG_plain].u_obj != mp_const_none) {
                if (plain && llm_fast(open->engine)) {
                    mp_raise_ValueError(MP_ERROR_TEXT("a fast model cannot be plain"));
                }
                llm_set_plain(open->engine, plain);
            }
            return MP_OBJ_FROM_PTR(open);
        }
        llm_release(open);
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
        if (((uintptr_t)data & 15u) != 0 || !mp_obj_is_type(image, &mp_type_bytes)) {
            /* the engine reads weights in place and its kernels need 16-byte
             * alignment; and anything but bytes (a bytearray, a memoryview)
             * could change or be resized under the open model: keep an
             * aligned private copy in port memory instead */
            llm_region placed;
            self->copy = port->alloc(port->ctx, len, LLM_REGION_BULK, &placed);
            if (self->copy == NULL) {
                llm_release(self);
                err.status = LLM_E_NOMEM;
                snprintf(err.message, sizeof(err.message),
                    "no memory for an aligned copy of the image (%lu bytes)", (unsigned long)len);
                llm_raise(&err);
            }
            memcpy(self->copy, data, len);
            data = self->copy;
        }
    }
    self->source = image;

    llm_engine *engine = NULL;
    if (llm_open(&engine, data, len, port, &err) != LLM_OK) {
        llm_release(self);
        llm_raise(&err);
    }
    llm_set_plain(engine, plain);
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
    if (!mp_obj_is_int(pos_in) || mp_obj_is_bool(pos_in)) {
        mp_raise_TypeError(MP_ERROR_TEXT("rewind() takes an int position"));
    }
    uint32_t now = llm_pos(e);
    if (!mp_obj_is_small_int(pos_in) || MP_OBJ_SMALL_INT_VALUE(pos_in) < 0 ||
        MP_OBJ_SMALL_INT_VALUE(pos_in) > (mp_int_t)now) {
        mp_raise_msg_varg(&mp_type_ValueError,
            MP_ERROR_TEXT("rewind position must be in 0..%u (the context holds %u tokens)"),
            (unsigned)now, (unsigned)now);
    }
    llm_error err;
    if (llm_rewind(e, (uint32_t)MP_OBJ_SMALL_INT_VALUE(pos_in), &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_rewind_obj, llm_model_rewind);

static void llm_dict_int(mp_obj_t d, qstr key, mp_uint_t v) {
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(key), mp_obj_new_int_from_uint(v));
}

static mp_obj_t llm_model_config(mp_obj_t self_in) {
    const llm_config *c = llm_get_config(llm_ready(self_in)->engine);
    mp_obj_t d = mp_obj_new_dict(15);
    llm_dict_int(d, MP_QSTR_vocab_rows, c->vocab_rows);
    llm_dict_int(d, MP_QSTR_vocab_out, c->vocab_out);
    llm_dict_int(d, MP_QSTR_dim, c->dim);
    llm_dict_int(d, MP_QSTR_n_layers, c->n_layers);
    llm_dict_int(d, MP_QSTR_n_heads, c->n_heads);
    llm_dict_int(d, MP_QSTR_head_dim, c->head_dim);
    llm_dict_int(d, MP_QSTR_ffn, c->ffn);
    llm_dict_int(d, MP_QSTR_ple_dim, c->ple_dim);
    llm_dict_int(d, MP_QSTR_seq_len, c->seq_len);
    llm_dict_int(d, MP_QSTR_group, c->group);
    llm_dict_int(d, MP_QSTR_eot_id, c->eot_id);
    llm_dict_int(d, MP_QSTR_flags, c->flags);
    llm_dict_int(d, MP_QSTR_max_draft, llm_draft_max(llm_ready(self_in)->engine));
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_rope_theta), mp_obj_new_float(c->rope_theta));
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_tied_head), mp_obj_new_bool(c->flags & 1u));
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_config_obj, llm_model_config);

/* 0 .. 2**64-1 from a small or big int, else ValueError/TypeError. */
static uint64_t llm_get_u64(mp_obj_t o, const char *what) {
    if (!mp_obj_is_int(o)) {
        mp_raise_msg_varg(&mp_type_TypeError, MP_ERROR_TEXT("%s must be an int"), what);
    }
    if (mp_obj_is_small_int(o)) {
        mp_int_t v = MP_OBJ_SMALL_INT_VALUE(o);
        if (v < 0) {
            mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("%s must be in 0..2**64-1"),
                what);
        }
        return (uint64_t)v;
    }
    uint8_t b[8];
    if (mp_obj_int_sign(o) < 0 || !mp_obj_int_to_bytes_impl(o, false, sizeof(b), b)) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("%s must be in 0..2**64-1"), what);
    }
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | b[i];
    }
    return v;
}

static mp_obj_t llm_model_sampler(size_t n_args, const mp_obj_t *pos_args, mp_map_t *kw_args) {
    enum { ARG_temperature, ARG_top_k, ARG_seed };
    static const mp_arg_t allowed_args[] = {
        { MP_QSTR_temperature, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_top_k, MP_ARG_INT, {.u_int = 0} },
        { MP_QSTR_seed, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
    };
    mp_arg_val_t args[MP_ARRAY_SIZE(allowed_args)];
    mp_arg_parse_all(n_args - 1, pos_args + 1, kw_args, MP_ARRAY_SIZE(allowed_args),
        allowed_args, args);
    llm_model_obj_t *self = llm_ready(pos_args[0]);
    mp_float_t t = 0;
    if (args[ARG_temperature].u_obj != mp_const_none) {
        t = mp_obj_get_float(args[ARG_temperature].u_obj);
    }
    /* written so that NaN fails too */
    if (!(t >= 0) || t > (mp_float_t)3.4e38) {
        mp_raise_ValueError(MP_ERROR_TEXT("temperature must be finite and >= 0"));
    }
    const llm_config *c = llm_get_config(self->engine);
    mp_int_t top_k = args[ARG_top_k].u_int;
    if (top_k < 0 || (mp_uint_t)top_k > c->vocab_out) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("top_k must be in 0..%u, got %d"),
            (unsigned)c->vocab_out, (int)top_k);
    }
    llm_sampler_options opt;
    opt.temperature = (float)t;
    opt.top_k = (uint32_t)top_k;
    opt.seed = args[ARG_seed].u_obj == mp_const_none ? 0 : llm_get_u64(args[ARG_seed].u_obj, "seed");
    llm_error err;
    if (llm_set_sampler(self->engine, &opt, &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_KW(llm_model_sampler_obj, 1, llm_model_sampler);

/* A token argument: an int in the embedding's range, else TypeError/ValueError. */
static int32_t llm_token_arg(llm_model_obj_t *self, mp_obj_t o) {
    if (!mp_obj_is_int(o)) {
        mp_raise_TypeError(MP_ERROR_TEXT("token ids must be int"));
    }
    uint32_t rows = llm_get_config(self->engine)->vocab_rows;
    if (!mp_obj_is_small_int(o)) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("token id out of range 0..%u"),
            (unsigned)(rows - 1u));
    }
    mp_int_t v = MP_OBJ_SMALL_INT_VALUE(o);
    if (v < 0 || v >= (mp_int_t)rows) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("token id %d out of range 0..%u"),
            (int)v, (unsigned)(rows - 1u));
    }
    return (int32_t)MP_OBJ_SMALL_INT_VALUE(o);
}

/* A sequence of token ids as a fresh array of *n (m_del it). Iterating runs
 * user code, which may close the model: the open check is repeated after
 * it, before the engine's config is read. */
static int32_t *llm_tokens_arg(mp_obj_t self_in, mp_obj_t tokens, size_t max_n, size_t *n_out,
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
    if (n == 0) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("%s needs at least one token"), name);
    }
    if (n > max_n) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("%s takes at most %u tokens, got %u"),
            name, (unsigned)max_n, (unsigned)n);
    }
    int32_t *ids = m_new(int32_t, n);
    for (size_t i = 0; i < n; i++) {
        ids[i] = llm_token_arg(self, items[i]);
    }
    *n_out = n;
    return ids;
}

static mp_obj_t llm_model_prefill(mp_obj_t self_in, mp_obj_t tokens) {
    llm_ready(self_in);
    size_t n;
    int32_t *ids = llm_tokens_arg(self_in, tokens, UINT32_MAX / 2u, &n, "prefill()");
    llm_model_obj_t *self = llm_ready(self_in);
    llm_check_interrupt();
    llm_error err;
    int32_t next = 0;
    llm_status st = llm_prefill(self->engine, ids, (uint32_t)n, &next, &err);
    m_del(int32_t, ids, n);
    if (st != LLM_OK) {
        llm_raise(&err);
    }
    return MP_OBJ_NEW_SMALL_INT(next);
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_prefill_obj, llm_model_prefill);

static mp_obj_t llm_model_draft(mp_obj_t self_in, mp_obj_t context, mp_obj_t max_len_in) {
    llm_ready(self_in);
    mp_int_t max_len = mp_obj_get_int(max_len_in);
    if (max_len < 0) {
        mp_raise_msg_varg(&mp_type_ValueError, MP_ERROR_TEXT("draft() max_len must be >= 0, got %d"),
            (int)max_len);
    }
    size_t n;
    int32_t *ids = llm_tokens_arg(self_in, context, UINT32_MAX / 2u, &n, "draft()");
    llm_model_obj_t *self = llm_ready(self_in);
    int32_t out[LLM_IMAGE_DRAFTS_MAX];
    uint32_t want = max_len > (mp_int_t)LLM_IMAGE_DRAFTS_MAX ? LLM_IMAGE_DRAFTS_MAX
                                                             : (uint32_t)max_len;
    uint32_t got = llm_draft(self->engine, ids, (uint32_t)n, want, out);
    m_del(int32_t, ids, n);
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
    int32_t *ids = llm_tokens_arg(self_in, tokens, LLM_VERIFY_MAX, &n, "verify()");
    llm_model_obj_t *self = llm_ready(self_in);
    llm_check_interrupt();
    llm_error err;
    int32_t next[LLM_VERIFY_MAX];
    llm_status st = llm_verify(self->engine, ids, (uint32_t)n, next, &err);
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
    if (llm_step(self->engine, id, &next, &err) != LLM_OK) {
        llm_raise(&err);
    }
    return MP_OBJ_NEW_SMALL_INT(next);
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_step_obj, llm_model_step);

static mp_obj_t llm_model_logits(mp_obj_t self_in) {
    llm_model_obj_t *self = llm_ready(self_in);
    const float *l = llm_logits(self->engine);
    if (l == NULL) {
        llm_raise_state("no logits yet: call prefill() or step() first");
    }
    /* float32 little-endian, like the CPython binding: both targets are LE */
    return mp_obj_new_bytes((const byte *)l, (size_t)llm_get_config(self->engine)->vocab_out * 4u);
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_logits_obj, llm_model_logits);

static mp_obj_t llm_model_tokenizer(mp_obj_t self_in) {
    llm_model_obj_t *self = llm_ready(self_in);
    size_t len = 0;
    const uint8_t *p = llm_tokenizer(self->engine, &len);
    return mp_obj_new_bytes(p, len);
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_tokenizer_obj, llm_model_tokenizer);

static mp_obj_t llm_ms(uint64_t us) {
    return mp_obj_new_float((mp_float_t)us / (mp_float_t)1000);
}

static mp_obj_t llm_model_stats(mp_obj_t self_in) {
    llm_stats s;
    llm_get_stats(llm_ready(self_in)->engine, &s);
    mp_obj_t d = mp_obj_new_dict(12);
    llm_dict_int(d, MP_QSTR_tokens, s.tokens);
    llm_dict_int(d, MP_QSTR_prefill_tokens, s.prefill_tokens);
    llm_dict_int(d, MP_QSTR_heads, s.heads);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_head_rows), mp_obj_new_int_from_ull(s.head_rows));
    llm_dict_int(d, MP_QSTR_head_tiles, s.head_tiles);
    llm_dict_int(d, MP_QSTR_head_waves, s.head_waves);
    llm_dict_int(d, MP_QSTR_handoffs, s.handoffs);
    llm_dict_int(d, MP_QSTR_v_wide, s.v_wide);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_ttft_ms), llm_ms(s.prefill_us));
    mp_obj_t ms = mp_obj_new_dict(LLM_STAGE_COUNT);
    uint64_t total = 0;
    for (int i = 0; i < LLM_STAGE_COUNT; i++) {
        total += s.stage_us[i];
        const char *name = llm_stage_name((llm_stage)i);
        mp_obj_dict_store(ms, mp_obj_new_str(name, strlen(name)), llm_ms(s.stage_us[i]));
    }
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_stage_ms), ms);
    mp_obj_dict_store(d, MP_OBJ_NEW_QSTR(MP_QSTR_total_ms), llm_ms(total));
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

static mp_obj_t llm_model_set_fast(mp_obj_t self_in, mp_obj_t on) {
    llm_error err;
    if (llm_set_fast(llm_ready(self_in)->engine, mp_obj_is_true(on), &err) != LLM_OK) {
        llm_raise(&err);
    }
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_2(llm_model_set_fast_obj, llm_model_set_fast);

static mp_obj_t llm_model_fast(mp_obj_t self_in) {
    return mp_obj_new_bool(llm_fast(llm_ready(self_in)->engine));
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_fast_obj, llm_model_fast);

static mp_obj_t llm_model_set_plain(mp_obj_t self_in, mp_obj_t on) {
    if (mp_obj_is_true(on) && llm_fast(llm_ready(self_in)->engine)) {
        mp_raise_ValueError(MP_ERROR_TEXT("a fast model cannot be plain"));
    }
    llm_set_plain(llm_ready(self_in)->engine, mp_obj_is_true(on));
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

static const MP_DEFINE_STR_OBJ(llm_version_obj, LLM_VERSION);

static const mp_rom_map_elem_t llm_module_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR__llm) },
    { MP_ROM_QSTR(MP_QSTR_Model), MP_ROM_PTR(&llm_type_Model) },
    { MP_ROM_QSTR(MP_QSTR_Error), MP_ROM_PTR(&llm_type_Error) },
    { MP_ROM_QSTR(MP_QSTR_build_info), MP_ROM_PTR(&llm_build_info_obj) },
    { MP_ROM_QSTR(MP_QSTR___version__), MP_ROM_PTR(&llm_version_obj) },
};
static MP_DEFINE_CONST_DICT(llm_module_globals, llm_module_globals_table);

const mp_obj_module_t llm_user_cmodule = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&llm_module_globals,
};

MP_REGISTER_MODULE(MP_QSTR__llm, llm_user_cmodule);
MP_REGISTER_ROOT_POINTER(struct _llm_model_obj_t *llm_open_model);
