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

/* Give up what the object holds. Ctrl-C is held back throughout, and each
 * flag is cleared before the step it guards: on the unix port's default build
 * a SIGINT longjmps out of whatever C code runs, and one taken right after
 * munmap left `mapped` set, so the finaliser later unmapped whatever had been
 * mapped at that address since (another model). Ctrl-C held back also keeps
 * the GIL build alive: there a second SIGINT that finds the first one still
 * pending exits the process (ports/unix/unix_mphal.c, sighandler), and a
 * KeyboardInterrupt made pending half-way through would stay pending across
 * the munmap. Raises nothing (it runs from finalisers). */
static void llm_release(llm_model_obj_t *self) {
    const int held = mpllm_interrupts_hold();
    if (self->m.engine != NULL || self->m.copy != NULL) {
        llm_bind_close(&self->m);
        mpllm_test_point("released");
    }
    if (self->mapped) {
        self->mapped = false;
        mpllm_unmap(&self->map);
        mpllm_test_point("unmapped");
    }
    if (self->port_ready) {
        self->port_ready = false;
        mpllm_port_deinit(&self->port);
    }
    self->source = mp_const_none;
    if (MP_STATE_VM(llm_open_model) == self) {
        MP_STATE_VM(llm_open_model) = NULL;
    }
    mpllm_interrupts_allow(held);
}

/* Everything Model() does once its arguments are read: nothing here raises,
 * so it all runs with Ctrl-C held back (llm_release says why). `open` is the
 * open model to give up, NULL if none: only for an image that will open (a
 * bad one leaves it as it was; the board has memory for one model). */
static llm_bind_kind llm_model_open(llm_model_obj_t *self, llm_model_obj_t *open,
    const char *name, const mp_buffer_info_t *buf, int in_place, int plain, int fast,
    uint32_t context, llm_bind_error *e) {
    llm_error err;
    if (mpllm_port_init(&self->port, &err) != LLM_OK) {
        return llm_bind_status(&err, e);
    }
    self->port_ready = true;
    self->m.port = mpllm_port_get(&self->port);
    const uint8_t *data;
    size_t len = buf->len;
    if (name != NULL) {
        int sys_errno = 0;
        if (mpllm_map(name, &self->map, &sys_errno, &err) != LLM_OK) {
            return llm_bind_map_failed(&err, sys_errno, e);
        }
        self->mapped = true;
        data = mpllm_map_data(&self->map);
        len = mpllm_map_len(&self->map);
    } else if (llm_bind_place(&self->m, buf->buf, len, in_place, &data, e) != LLM_BIND_OK) {
        return e->kind;
    }
    if (open != NULL) {
        const llm_open_options options = {context, 0}; /* a check only: plain changes no check */
        if (llm_check_open(data, len, &options, &err) != LLM_OK) {
            return llm_bind_status(&err, e);
        }
        llm_release(open);
    }
    return llm_bind_open(&self->m, data, len, plain, fast, context, llm_poll, e);
}

static mp_obj_t llm_model_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw,
    const mp_obj_t *all_args) {
    static const mp_arg_t allowed[] = {
        { MP_QSTR_image, MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_plain, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_fast, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
        { MP_QSTR_context, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_rom_obj = MP_ROM_NONE} },
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
    uint32_t context = 0; /* the image's seq_len */
    if (args[3].u_obj != mp_const_none) {
        llm_check(llm_bind_context(llm_int(args[3].u_obj, "context", 63), &context, &e), &e);
    }
    if (image == mp_const_none) {
        #ifdef MPLLM_DEFAULT_SOURCE
        image = mp_obj_new_str(MPLLM_DEFAULT_SOURCE, strlen(MPLLM_DEFAULT_SOURCE));
        #else
        llm_check(llm_bind_not_image(mp_obj_get_type_str(image), &e), &e); /* as on CPython */
        #endif
    }
    mp_buffer_info_t buf = {0};
    const char *name = NULL;
    if (mp_obj_is_str(image)) {
        size_t n;
        name = mp_obj_str_get_data(image, &n);
        llm_check(llm_bind_path(name, n, &e), &e); /* open() would stop at a NUL */
    } else if (!mp_get_buffer(image, &buf, MP_BUFFER_READ)) {
        llm_check(llm_bind_not_image(mp_obj_get_type_str(image), &e), &e);
    }
    llm_model_obj_t *open = MP_STATE_VM(llm_open_model);
    const bool shared = open != NULL && open->m.engine != NULL;
    /* the same path: the open model in the modes asked for, unless another
     * context is asked (the KV cache is sized at open: opened again) */
    const bool same_context = context == 0 ||
        (shared && llm_get_config(open->m.engine)->seq_len == context);
    if (shared && same_context && name != NULL && mp_obj_is_str(open->source) &&
        mp_obj_equal(open->source, image)) {
        const int held = mpllm_interrupts_hold();
        llm_bind_kind kind = llm_bind_remode(&open->m, plain_given, plain, fast_given, fast, &e);
        llm_interrupts_allow(held);
        llm_check(kind, &e);
        return MP_OBJ_FROM_PTR(open);
    }

    llm_model_obj_t *self = mp_obj_malloc_with_finaliser(llm_model_obj_t, type);
    self->m = (llm_bind_model) {NULL, NULL, NULL, 0};
    self->mapped = self->port_ready = false;
    self->source = mp_const_none;
    const int held = mpllm_interrupts_hold();
    llm_bind_kind kind = llm_model_open(self, shared ? open : NULL, name, &buf,
        mp_obj_is_type(image, &mp_type_bytes), plain, fast, context, &e);
    if (kind == LLM_BIND_OK) {
        /* a path (for the next Model() call) or the buffer used in place; not
         * a buffer that was copied: the image is then held once, in the copy */
        self->source = self->m.copy == NULL ? image : mp_const_none;
        MP_STATE_VM(llm_open_model) = self;
    } else {
        llm_release(self);
    }
    llm_interrupts_allow(held);
    llm_check(kind, &e);
    return MP_OBJ_FROM_PTR(self);
}

/* close() and the finaliser: "in use" while a result is built (a finaliser
 * run by one of its allocations), else release. */
static void llm_model_release_unless_busy(mp_obj_t self_in) {
    llm_model_obj_t *self = MP_OBJ_TO_PTR(self_in);
    if (self->m.busy) {
        llm_ready(self_in); /* raises "in use" */
    }
    llm_release(self);
}

static mp_obj_t llm_model_del(mp_obj_t self_in) {
    llm_model_release_unless_busy(self_in);
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_1(llm_model_del_obj, llm_model_del);

static mp_obj_t llm_model_close(mp_obj_t self_in) {
    llm_model_release_unless_busy(self_in);
    /* a Ctrl-C held back by the release: raised now, by close() itself */
    mp_handle_pending(MP_HANDLE_PENDING_CALLBACKS_AND_EXCEPTIONS);
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
 * (no heap copy: 368 KB on the release model) and asked of the model at
 * every access, so once the model is closed (by close(), or by Model() of
 * another source, or llm.load() of another image) an access is an Error,
 * never a read of unmapped memory. Indexing gives ints, slicing bytes (a copy
 * of just the slice).
 *
 * It lends no buffer, so there is no memoryview of it: a MicroPython
 * memoryview keeps only the pointer it was lent, not the object that lent it
 * (py/objarray.c, memoryview_make_new), and the GC follows only pointers to
 * the start of a heap block. Nothing could then keep the image mapped while
 * a view lives, and a view kept past close() read unmapped memory (on the
 * board: flash pages no longer mapped; on unix: SIGSEGV). A copy per view
 * instead would spend the board's scarce RAM on what flash already holds. */
typedef struct {
    mp_obj_base_t base;
    mp_obj_t model;
} llm_section_obj_t;

static const uint8_t *llm_section_data(mp_obj_t self_in, size_t *len) {
    llm_section_obj_t *self = MP_OBJ_TO_PTR(self_in);
    return llm_tokenizer(llm_ready(self->model)->m.engine, len);
}

static mp_obj_t llm_section_slice(mp_obj_t self_in, mp_obj_t slice) {
    size_t len;
    llm_section_data(self_in, &len);
    mp_bound_slice_t s;
    mp_obj_slice_indices(slice, (mp_int_t)len, &s);
    const mp_int_t span = s.step > 0 ? s.stop - s.start : s.start - s.stop;
    const mp_int_t step = s.step > 0 ? s.step : -s.step;
    const size_t n = span > 0 ? (size_t)((span - 1) / step + 1) : 0;
    vstr_t out;
    vstr_init_len(&out, n);
    /* the bytes are found only now: the allocation may have run a finaliser
     * that closed the model */
    const uint8_t *p = llm_section_data(self_in, &len);
    for (size_t i = 0; i < n; i++) {
        out.buf[i] = (char)p[s.start + (mp_int_t)i * s.step];
    }
    return mp_obj_new_bytes_from_vstr(&out);
}

static mp_obj_t llm_section_subscr(mp_obj_t self_in, mp_obj_t index, mp_obj_t value) {
    if (value != MP_OBJ_SENTINEL) {
        return MP_OBJ_NULL; /* read-only: store and delete are TypeErrors */
    }
    if (mp_obj_is_type(index, &mp_type_slice)) {
        return llm_section_slice(self_in, index);
    }
    size_t len, at;
    const uint8_t *p = llm_section_data(self_in, &len);
    if (!mp_obj_is_int(index)) { /* a bool, or MicroPython's TypeError */
        return MP_OBJ_NEW_SMALL_INT(p[mp_get_index(mp_obj_get_type(self_in), len, index, false)]);
    }
    llm_bind_error e;
    llm_check(llm_bind_section_index(len, llm_int(index, "an index", 63), &at, &e), &e);
    return MP_OBJ_NEW_SMALL_INT(p[at]);
}

static mp_obj_t llm_section_unary_op(mp_unary_op_t op, mp_obj_t self_in) {
    size_t len;
    return op == MP_UNARY_OP_LEN ? (llm_section_data(self_in, &len), MP_OBJ_NEW_SMALL_INT(len))
        : MP_OBJ_NULL;
}

/* What asks for a buffer (memoryview(), bytes(), ...) hears why there is
 * none, rather than MicroPython's "object with buffer protocol required". */
static mp_int_t llm_section_get_buffer(mp_obj_t self_in, mp_buffer_info_t *info, mp_uint_t flags) {
    (void)self_in, (void)info, (void)flags;
    mp_raise_TypeError(MP_ERROR_TEXT("a Section lends no buffer (a view could outlive the "
        "model's image): t[a:b] gives bytes"));
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
    { MP_ROM_QSTR(MP_QSTR___del__), MP_ROM_PTR(&llm_model_del_obj) },
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

/* An optional int argument (None: not given). */
static int llm_opt_int(mp_obj_t o, const char *what, llm_bind_int *out) {
    if (o == mp_const_none) {
        return 0;
    }
    *out = llm_int(o, what, 63);
    return 1;
}

/* One llm_bind_plan through a port of the platform taken for it (raising
 * only once it is given back). */
static void llm_plan_run(const uint8_t *data, size_t len, const llm_bind_plan_args *a,
    llm_placement *blocks, uint32_t cap, llm_bind_plan_out *out, llm_bind_error *e) {
    mpllm_port_t port;
    llm_error err;
    if (mpllm_port_init(&port, &err) != LLM_OK) {
        llm_bind_status(&err, e);
        llm_raise(e);
    }
    llm_bind_plan(mpllm_port_get(&port), data, len, a, blocks, cap, out, e);
    mpllm_port_deinit(&port);
    if (e->kind != LLM_BIND_OK) {
        llm_raise(e);
    }
}

/* plan(image, *, fast=None, bulk=None, context=0, plain=False,
 * bulk_is_fast=None, block_overhead=None): _llm.pyi. Every argument is read
 * (which may raise) before the port is taken, and the port given back
 * before the result is built, so no exception leaves it taken. */
static mp_obj_t llm_plan_fn(size_t n_args, const mp_obj_t *pos, mp_map_t *kw) {
    enum { ARG_image, ARG_fast, ARG_bulk, ARG_context, ARG_plain, ARG_bulk_is_fast, ARG_overhead };
    static const mp_arg_t allowed[] = {
        { MP_QSTR_image, MP_ARG_REQUIRED | MP_ARG_OBJ, {.u_obj = MP_OBJ_NULL} },
        { MP_QSTR_fast, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_obj = mp_const_none} },
        { MP_QSTR_bulk, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_obj = mp_const_none} },
        /* not given: 0 (the image's seq_len); None: Model()'s own choice */
        { MP_QSTR_context, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_obj = MP_OBJ_NULL} },
        { MP_QSTR_plain, MP_ARG_KW_ONLY | MP_ARG_BOOL, {.u_bool = false} },
        { MP_QSTR_bulk_is_fast, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_obj = mp_const_none} },
        { MP_QSTR_block_overhead, MP_ARG_KW_ONLY | MP_ARG_OBJ, {.u_obj = mp_const_none} },
    };
    mp_arg_val_t v[MP_ARRAY_SIZE(allowed)];
    mp_arg_parse_all(n_args, pos, kw, MP_ARRAY_SIZE(allowed), allowed, v);
    llm_bind_plan_args a = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, 0, 0, 0, 0, 0, v[ARG_plain].u_bool, 0};
    a.fast_given = llm_opt_int(v[ARG_fast].u_obj, "plan() fast", &a.fast);
    a.bulk_given = llm_opt_int(v[ARG_bulk].u_obj, "plan() bulk", &a.bulk);
    a.fit = v[ARG_context].u_obj == mp_const_none;
    if (v[ARG_context].u_obj != MP_OBJ_NULL) {
        llm_opt_int(v[ARG_context].u_obj, "plan() context", &a.context);
    }
    a.overhead_given = llm_opt_int(v[ARG_overhead].u_obj, "plan() block_overhead",
        &a.block_overhead);
    a.bulk_is_fast_given = v[ARG_bulk_is_fast].u_obj != mp_const_none;
    a.bulk_is_fast = a.bulk_is_fast_given && mp_obj_is_true(v[ARG_bulk_is_fast].u_obj);
    mp_buffer_info_t buf;
    mp_get_buffer_raise(v[ARG_image].u_obj, &buf, MP_BUFFER_READ);
    const uint8_t *data = buf.buf;
    /* volatile: held on the stack, where the GC finds it, until the result is built */
    uint8_t *volatile copy = NULL;
    if (((uintptr_t)data & 15u) != 0) { /* the engine reads the image 16-byte aligned */
        copy = m_new(uint8_t, buf.len + 16u);
        data = (const uint8_t *)(((uintptr_t)copy + 15u) & ~(uintptr_t)15u);
        memcpy((uint8_t *)data, buf.buf, buf.len);
    }
    /* twice: the first plan says how many blocks the second keeps (a port is
     * taken for each, its scratch, and given back before anything can raise) */
    llm_placement *blocks = NULL;
    llm_bind_plan_out out;
    for (uint32_t cap = 0;; cap = out.plan.n) {
        llm_bind_error e;
        llm_plan_run(data, buf.len, &a, blocks, cap, &out, &e);
        if (!out.opens || cap != 0) {
            break;
        }
        blocks = m_new(llm_placement, out.plan.n + 1u);
    }
    mp_obj_t d = llm_plan_dict(&out);
    copy = NULL;
    return d;
}
static MP_DEFINE_CONST_FUN_OBJ_KW(llm_plan_obj, 1, llm_plan_fn);

static const MP_DEFINE_STR_OBJ(llm_version_obj, LLM_VERSION);

static const mp_rom_map_elem_t llm_module_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR__llm) },
    { MP_ROM_QSTR(MP_QSTR_Model), MP_ROM_PTR(&llm_type_Model) },
    { MP_ROM_QSTR(MP_QSTR_Error), MP_ROM_PTR(&llm_type_Error) },
    { MP_ROM_QSTR(MP_QSTR_build_info), MP_ROM_PTR(&llm_build_info_obj) },
    { MP_ROM_QSTR(MP_QSTR_selftest), MP_ROM_PTR(&llm_selftest_obj) },
    { MP_ROM_QSTR(MP_QSTR_plan), MP_ROM_PTR(&llm_plan_obj) },
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
