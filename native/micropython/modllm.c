/*
 * MicroPython `_llm`: the engine behind the Python API documented once in
 * firmware/modules/_llm.pyi. The binding core (native/binding/llm_bind.h)
 * decides every rule, message and return value; this file is glue in
 * MicroPython's dialect.
 *
 * What is specific to MicroPython:
 *   - One model is open at a time and it stays open across calls: the open
 *     model is a root pointer, so `llm.story()` after `llm.story()` does not
 *     map and stage the image again. Model() naming the same source returns
 *     the open model; another source closes it first (its memory, outside
 *     the GC heap, could not hold two on the board).
 *   - Soft reset frees it: the object has a finaliser, which gc_sweep_all()
 *     runs on soft reset (and the unix port's coverage build at exit).
 *   - Ctrl-C: a pending KeyboardInterrupt is raised before each engine call,
 *     and a long prefill polls for it between passes (modllm_platform.h).
 *   - Model() with no argument opens the board's `model` partition; a str
 *     names a partition (board) or a file (unix); a bytes-like object is an
 *     image in RAM.
 */
#include <string.h>

#include "py/objstr.h"
#include "py/runtime.h"

#include "modllm_call.h"
#include "selftest.h"


#define LLM_METHOD(name, doc) \
    static mp_obj_t llm_m_##name(size_t n, const mp_obj_t *a, mp_map_t *kw) { \
        return llm_call(LLM_BIND_M_##name, n, a, kw); \
    } \
    static MP_DEFINE_CONST_FUN_OBJ_KW(llm_m_##name##_obj, 1, llm_m_##name);
LLM_BIND_METHODS(LLM_METHOD)

/* ---- the object's own: open, close, tokenizer --------------------------- */

static void llm_release(llm_model_obj_t *self) {
    const int held = mpllm_interrupts_hold(); /* a Ctrl-C must not cut llm_close half-way */
    llm_bind_close(&self->m);
    mpllm_interrupts_allow(held);
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

/* A failure while opening: give up what this object holds, then raise. */
static void llm_open_check(llm_model_obj_t *self, llm_bind_kind kind, const llm_bind_error *e) {
    if (kind != LLM_BIND_OK) {
        llm_release(self);
        llm_raise(e);
    }
}

static mp_obj_t llm_model_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw,
    const mp_obj_t *all_args) {
    static const mp_arg_t allowed[] = {
        { MP_QSTR_image, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_plain, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_fast, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
    };
    mp_arg_val_t args[MP_ARRAY_SIZE(allowed)];
    mp_arg_parse_all_kw_array(n_args, n_kw, all_args, MP_ARRAY_SIZE(allowed), allowed, args);
    mp_obj_t image = args[0].u_obj;
    const bool plain_given = args[1].u_obj != mp_const_none;
    const bool fast_given = args[2].u_obj != mp_const_none;
    const int plain = plain_given && mp_obj_is_true(args[1].u_obj);
    const int fast = fast_given && mp_obj_is_true(args[2].u_obj);
    llm_bind_error e;
    llm_check(llm_bind_modes(plain, fast, &e), &e);
    if (image == mp_const_none) {
        #ifdef MPLLM_DEFAULT_SOURCE
        image = mp_obj_new_str(MPLLM_DEFAULT_SOURCE, strlen(MPLLM_DEFAULT_SOURCE));
        #else
        mp_raise_TypeError(MP_ERROR_TEXT("Model() needs an image: a path or a buffer"));
        #endif
    }
    mp_buffer_info_t buf = {0};
    const char *name = mp_obj_is_str(image) ? mp_obj_str_get_str(image) : NULL;
    if (name == NULL) {
        mp_get_buffer_raise(image, &buf, MP_BUFFER_READ);
    }
    llm_model_obj_t *open = MP_STATE_VM(llm_open_model);
    const bool shared = open != NULL && open->m.engine != NULL;
    if (shared && name != NULL && mp_obj_is_str(open->source) && mp_obj_equal(open->source, image)) {
        const int held = mpllm_interrupts_hold();
        llm_bind_kind kind = llm_bind_remode(&open->m, plain_given, plain, fast_given, fast, &e);
        mpllm_interrupts_allow(held);
        llm_check(kind, &e);
        return MP_OBJ_FROM_PTR(open);
    }

    llm_model_obj_t *self = mp_obj_malloc_with_finaliser(llm_model_obj_t, type);
    self->m = (llm_bind_model) {NULL, NULL, NULL, 0};
    self->mapped = self->port_ready = false;
    self->source = mp_const_none;
    llm_error err;
    llm_open_check(self, mpllm_port_init(&self->port, &err) == LLM_OK ? LLM_BIND_OK
        : llm_bind_status(&err, &e), &e);
    self->port_ready = true;
    self->m.port = mpllm_port_get(&self->port);
    const uint8_t *data;
    size_t len;
    if (name != NULL) {
        int sys_errno = 0;
        if (mpllm_map(name, &self->map, &sys_errno, &err) != LLM_OK) {
            llm_release(self);
            if (sys_errno != 0) {
                mp_raise_OSError_with_filename(sys_errno, name);
            }
            llm_raise((llm_bind_status(&err, &e), &e));
        }
        self->mapped = true;
        data = mpllm_map_data(&self->map);
        len = mpllm_map_len(&self->map);
    } else {
        len = buf.len;
        llm_open_check(self, llm_bind_place(&self->m, buf.buf, len,
            mp_obj_is_type(image, &mp_type_bytes), &data, &e), &e);
    }
    /* a path (for the next Model() call) or the buffer used in place; not a
     * buffer that was copied: the image is then held once, in the copy */
    self->source = self->m.copy == NULL ? image : mp_const_none;
    if (shared) {
        /* the open model is given up only for an image that will open: a
         * bad one leaves it as it was (the board has memory for one model) */
        const int held = mpllm_interrupts_hold();
        const llm_status checked = llm_check_image(data, len, &err);
        mpllm_interrupts_allow(held);
        llm_open_check(self, checked == LLM_OK ? LLM_BIND_OK : llm_bind_status(&err, &e), &e);
        llm_release(open);
    }
    llm_open_check(self, llm_open_held(&self->m, data, len, plain, fast, &e), &e);
    MP_STATE_VM(llm_open_model) = self;
    return MP_OBJ_FROM_PTR(self);
}

static mp_obj_t llm_model_close(mp_obj_t self_in) {
    llm_model_obj_t *self = MP_OBJ_TO_PTR(self_in);
    if (self->m.busy) {
        llm_ready(self_in); /* "in use": a finaliser run while a result is built */
    }
    llm_release(self);
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

/* tokenizer() is a _llm.Section: the image's tokenizer section read in place
 * (no heap copy: 368 KB on the release model). It asks the model for the
 * bytes at every access, so once the model is closed an access is an Error,
 * never a read of unmapped memory. Indexing gives ints, slicing bytes, the
 * buffer protocol a read-only view (which, like any MicroPython memoryview,
 * must not be kept past close()). */
typedef struct {
    mp_obj_base_t base;
    mp_obj_t model;
} llm_section_obj_t;

static const uint8_t *llm_section_data(mp_obj_t self_in, size_t *len) {
    llm_section_obj_t *self = MP_OBJ_TO_PTR(self_in);
    return llm_tokenizer(llm_ready(self->model)->m.engine, len);
}

static mp_obj_t llm_section_subscr(mp_obj_t self_in, mp_obj_t index, mp_obj_t value) {
    if (value != MP_OBJ_SENTINEL) {
        return MP_OBJ_NULL; /* read-only: store and delete are TypeErrors */
    }
    size_t len;
    const uint8_t *p = llm_section_data(self_in, &len);
    if (mp_obj_is_type(index, &mp_type_slice)) {
        mp_bound_slice_t s;
        if (!mp_seq_get_fast_slice_indexes(len, index, &s)) {
            mp_raise_NotImplementedError(MP_ERROR_TEXT("slice step"));
        }
        return mp_obj_new_bytes(p + s.start, s.stop > s.start ? (size_t)(s.stop - s.start) : 0);
    }
    return MP_OBJ_NEW_SMALL_INT(p[mp_get_index(mp_obj_get_type(self_in), len, index, false)]);
}

static mp_obj_t llm_section_unary_op(mp_unary_op_t op, mp_obj_t self_in) {
    size_t len;
    return op == MP_UNARY_OP_LEN ? (llm_section_data(self_in, &len), MP_OBJ_NEW_SMALL_INT(len))
        : MP_OBJ_NULL;
}

static mp_int_t llm_section_get_buffer(mp_obj_t self_in, mp_buffer_info_t *info, mp_uint_t flags) {
    if (flags & MP_BUFFER_WRITE) {
        return 1;
    }
    info->buf = (void *)llm_section_data(self_in, &info->len);
    info->typecode = 'B';
    return 0;
}

MP_DEFINE_CONST_OBJ_TYPE(llm_type_Section, MP_QSTR_Section, MP_TYPE_FLAG_NONE,
    subscr, llm_section_subscr, unary_op, llm_section_unary_op, buffer, llm_section_get_buffer);

static mp_obj_t llm_model_tokenizer(mp_obj_t self_in) {
    llm_ready(self_in);
    llm_section_obj_t *o = mp_obj_malloc(llm_section_obj_t, &llm_type_Section);
    o->model = self_in;
    return MP_OBJ_FROM_PTR(o);
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_tokenizer_obj, llm_model_tokenizer);

#define LLM_ENTRY(name, doc) { MP_ROM_QSTR(MP_QSTR_##name), MP_ROM_PTR(&llm_m_##name##_obj) },
static const mp_rom_map_elem_t llm_model_locals_dict_table[] = {
    LLM_BIND_METHODS(LLM_ENTRY)
    { MP_ROM_QSTR(MP_QSTR_tokenizer), MP_ROM_PTR(&llm_model_tokenizer_obj) },
    { MP_ROM_QSTR(MP_QSTR_close), MP_ROM_PTR(&llm_model_close_obj) },
    { MP_ROM_QSTR(MP_QSTR___enter__), MP_ROM_PTR(&llm_model_enter_obj) },
    { MP_ROM_QSTR(MP_QSTR___exit__), MP_ROM_PTR(&llm_model_exit_obj) },
    { MP_ROM_QSTR(MP_QSTR___del__), MP_ROM_PTR(&llm_model_close_obj) },
};
static MP_DEFINE_CONST_DICT(llm_model_locals_dict, llm_model_locals_dict_table);

MP_DEFINE_CONST_OBJ_TYPE(llm_type_Model, MP_QSTR_Model, MP_TYPE_FLAG_NONE,
    make_new, llm_model_make_new, locals_dict, &llm_model_locals_dict);

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
    char summary[192];
    llm_bind_selftest_summary(&acc.sum, summary, sizeof(summary));
    mp_printf(&mp_plat_print, "%s\n", summary);
    return llm_selftest_dict(&acc.sum, acc.lines);
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
