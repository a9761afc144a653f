/*
 * CPython `_llm`: the engine behind the Python API documented once in
 * firmware/modules/_llm.pyi, the same API the MicroPython `_llm` exposes. The
 * binding core (native/binding/llm_bind.h) decides every rule, message and
 * return value; this file is glue in CPython's dialect: the GIL is released
 * around every engine call, and a long prefill polls for Ctrl-C between
 * passes.
 */
#include "mod_llm_call.h"

#include "selftest.h"
#include "align_up.h"
#include "port_host.h"


#define METHOD(name, doc)                                                              \
    static PyObject *Model_##name(ModelObject *self, PyObject *args, PyObject *kwds) { \
        return call(self, LLM_BIND_M_##name, args, kwds);                              \
    }
LLM_BIND_METHODS(METHOD)

/* ---- the object's own: open, close, tokenizer --------------------------- */

/* The image bytes (mapping, view or copy): kept while a tokenizer() view
 * reads them, even after close(). */
static void release(ModelObject *self) {
    if (self->m.engine != NULL) llm_close(self->m.engine);
    self->m.engine = NULL;
    if (self->exports > 0) return;
    llm_bind_close(&self->m);
    if (self->map.data != NULL) llm_host_unmap(&self->map);
    if (self->have_view) PyBuffer_Release(&self->view);
    self->have_view = 0;
}

/* The buffer protocol exports the tokenizer section, read-only and in place
 * (tokenizer() is a memoryview of it): the view keeps this object, and so
 * the image bytes, alive. */
static int Model_getbuffer(ModelObject *self, Py_buffer *view, int flags) {
    if (!ready(self)) return -1;
    size_t len = 0;
    const uint8_t *p = llm_tokenizer(self->m.engine, &len);
    if (PyBuffer_FillInfo(view, (PyObject *)self, (void *)p, (Py_ssize_t)len, 1, flags) != 0)
        return -1;
    self->exports++;
    return 0;
}

static void Model_releasebuffer(ModelObject *self, Py_buffer *view) {
    (void)view;
    if (--self->exports == 0 && self->m.engine == NULL) release(self);
}

static void Model_dealloc(ModelObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    release(self);
    Py_CLEAR(self->error);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Model_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args, (void)kwds;
    ModelObject *self = (ModelObject *)type->tp_alloc(type, 0); /* zeroed */
    if (self == NULL) return NULL;
    llm_port_host_init(&self->port);
    self->m.port = &self->port.port;
    module_state *st = PyModule_GetState(PyType_GetModule(type));
    self->error = Py_NewRef(st->error); /* Model is not subclassable: its module's type */
    return (PyObject *)self;
}

/* Map the file a str or os.PathLike names; 0 with the exception set. */
static int open_path(ModelObject *self, PyObject *image, llm_bind_error *e) {
    PyObject *fspath = PyOS_FSPath(image);
    /* the file system's bytes (PyUnicode_FSConverter would refuse a NUL with
     * its own message: the core's check reads these bytes instead) */
    PyObject *path = fspath == NULL           ? NULL
                     : PyUnicode_Check(fspath) ? PyUnicode_EncodeFSDefault(fspath)
                                               : Py_NewRef(fspath);
    Py_XDECREF(fspath);
    if (path == NULL) return 0;
    if (llm_bind_path(PyBytes_AS_STRING(path), (size_t)PyBytes_GET_SIZE(path), e) == LLM_BIND_OK) {
        llm_error err;
        llm_status st;
        int sys_errno = 0;
        Py_BEGIN_ALLOW_THREADS
        st = llm_host_map_file(PyBytes_AS_STRING(path), &self->map, &sys_errno, &err);
        Py_END_ALLOW_THREADS
        if (st != LLM_OK) llm_bind_map_failed(&err, sys_errno, e);
    }
    Py_DECREF(path);
    if (e->kind == LLM_BIND_OK) return 1;
    raise_bind(self->error, e);
    return 0;
}

static int Model_init(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"image", "plain", "fast", "context", NULL};
    PyObject *image, *context_obj = Py_None;
    int plain = 0, fast = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$ppO:Model", kwlist, &image, &plain, &fast,
                                     &context_obj))
        return -1;
    llm_bind_error e;
    if (llm_bind_modes(plain, fast, &e) != LLM_BIND_OK) return raise_bind(self->error, &e), -1;
    uint32_t context = 0; /* the image's seq_len */
    if (context_obj != Py_None) {
        llm_bind_int c;
        if (!int_arg(context_obj, "context", 0, &c)) return -1;
        if (llm_bind_context(c, &context, &e) != LLM_BIND_OK)
            return raise_bind(self->error, &e), -1;
    }
    if (self->m.engine != NULL || self->m.busy || self->exports > 0 || self->map.data != NULL) {
        PyErr_SetString(PyExc_TypeError, "Model.__init__ called twice");
        return -1;
    }
    const uint8_t *data;
    size_t len;
    if (PyUnicode_Check(image) || PyObject_HasAttrString(image, "__fspath__")) {
        if (!open_path(self, image, &e)) return -1;
        data = self->map.data;
        len = self->map.len;
    } else if (PyObject_CheckBuffer(image)) {
        if (PyObject_GetBuffer(image, &self->view, PyBUF_SIMPLE) != 0) return -1;
        self->have_view = 1;
        len = (size_t)self->view.len;
        /* read-only is not enough (a read-only view of a bytearray can change
         * under the model): only bytes is used in place */
        if (llm_bind_place(&self->m, self->view.buf, len, PyBytes_CheckExact(image), &data, &e)
            != LLM_BIND_OK)
            return release(self), raise_bind(self->error, &e), -1;
        if (self->m.copy != NULL) PyBuffer_Release(&self->view), self->have_view = 0;
    } else {
        return llm_bind_not_image(Py_TYPE(image)->tp_name, &e), raise_bind(self->error, &e), -1;
    }
    llm_bind_kind kind;
    self->m.busy = 1;
    Py_BEGIN_ALLOW_THREADS
    kind = llm_bind_open(&self->m, data, len, plain, fast, context, poll_signals, &e);
    Py_END_ALLOW_THREADS
    self->m.busy = 0;
    if (kind != LLM_BIND_OK) return release(self), raise_bind(self->error, &e), -1;
    return 0;
}

static PyObject *Model_close(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->m.busy) {
        ready(self); /* the error: the model is in use */
        return NULL;
    }
    release(self);
    Py_RETURN_NONE;
}

static PyObject *Model_enter(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    return ready(self) ? Py_NewRef(self) : NULL;
}

static PyObject *Model_exit(ModelObject *self, PyObject *args) {
    (void)args;
    return Model_close(self, NULL);
}

static PyObject *Model_tokenizer(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    return ready(self) ? PyMemoryView_FromObject((PyObject *)self) : NULL;
}

#define METHOD_ENTRY(name, doc) \
    {#name, (PyCFunction)(void (*)(void))Model_##name, METH_VARARGS | METH_KEYWORDS, doc},
static PyMethodDef Model_methods[] = {
    LLM_BIND_METHODS(METHOD_ENTRY)
    {"tokenizer", (PyCFunction)Model_tokenizer, METH_NOARGS,
     "tokenizer() -> memoryview: the image's tokenizer section, read in place."},
    {"close", (PyCFunction)Model_close, METH_NOARGS, "close(): release the model (idempotent)."},
    {"__enter__", (PyCFunction)Model_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Model_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Model_slots[] = {
    {Py_tp_new, Model_new},
    {Py_tp_init, Model_init},
    {Py_tp_dealloc, Model_dealloc},
    {Py_tp_methods, Model_methods},
    {Py_bf_getbuffer, Model_getbuffer},
    {Py_bf_releasebuffer, Model_releasebuffer},
    {Py_tp_doc, "Model(image, *, plain=False, fast=False, context=None): an mpllm model image, "
                "from a path (memory-mapped) or a bytes-like object (kept alive until close), "
                "holding context positions (None: the image's seq_len)."},
    {0, NULL},
};

static PyType_Spec Model_spec = {
    .name = "_llm.Model",
    .basicsize = sizeof(ModelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Model_slots,
};

/* ---- module ------------------------------------------------------------ */

typedef struct {
    PyObject *lines;
    llm_bind_selftest sum;
} selftest_acc;

static void selftest_line(void *user, const char *line) {
    selftest_acc *acc = user;
    llm_bind_selftest_line(&acc->sum, line);
    if (acc->lines == NULL) return; /* a failed append: MemoryError when the run ends */
    PyObject *s = PyUnicode_FromString(line);
    if (s == NULL || PyList_Append(acc->lines, s) != 0) Py_CLEAR(acc->lines);
    Py_XDECREF(s);
}

static PyObject *mod_selftest(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    selftest_acc acc = {PyList_New(0), {{0}, 0, 0, 0, 0}};
    if (acc.lines == NULL) return NULL;
    llm_selftest_run(selftest_line, &acc);
    char summary[192];
    llm_bind_selftest_summary(&acc.sum, summary, sizeof summary);
    PyObject *d = acc.lines == NULL ? NULL : selftest_dict(&acc.sum);
    if (d != NULL && PyDict_SetItemString(d, "lines", acc.lines) != 0) Py_CLEAR(d);
    Py_XDECREF(acc.lines);
    if (d != NULL) PySys_WriteStdout("%s\n", summary);
    return d;
}

static PyObject *mod_build_info(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyUnicode_FromString(llm_build_info());
}

/* An optional int argument: not given or None leaves *given 0. */
static int opt_int(PyObject *obj, const char *what, llm_bind_int *out, int *given) {
    *given = obj != NULL && obj != Py_None;
    return !*given || int_arg(obj, what, 0, out);
}

/* The plan with n blocks kept (a second dry run once the first said how
 * many), as the dict. `data` 16-byte aligned. */
static PyObject *plan_of(PyObject *module, const uint8_t *data, size_t len,
                         const llm_bind_plan_args *a) {
    llm_host_port hp; /* scratch only: unlimited, the memory is the arguments' */
    llm_port_host_init(&hp);
    llm_bind_plan_out out;
    llm_bind_error e;
    llm_placement *blocks = NULL;
    if (llm_bind_plan(&hp.port, data, len, a, NULL, 0, &out, &e) == LLM_BIND_OK && out.opens) {
        const uint32_t n = out.plan.n;
        blocks = PyMem_Malloc((size_t)n * sizeof *blocks + 1u);
        if (blocks == NULL) return PyErr_NoMemory();
        llm_bind_plan(&hp.port, data, len, a, blocks, n, &out, &e);
    }
    PyObject *d = e.kind == LLM_BIND_OK ? plan_dict(&out) : NULL;
    if (e.kind != LLM_BIND_OK)
        raise_bind(((module_state *)PyModule_GetState(module))->error, &e);
    PyMem_Free(blocks);
    return d;
}

static PyObject *mod_plan(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"image", "fast", "bulk", "context", "plain", "bulk_is_fast",
                         "block_overhead", NULL};
    PyObject *image, *fast = NULL, *bulk = NULL, *context = NULL, *bulk_is_fast = NULL,
                     *overhead = NULL;
    int plain = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOOpOO:plan", kw, &image, &fast, &bulk,
                                     &context, &plain, &bulk_is_fast, &overhead))
        return NULL;
    llm_bind_plan_args a = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, 0, 0, 0, 0, 0, plain, 0};
    int context_given;
    if (!opt_int(fast, "plan() fast", &a.fast, &a.fast_given) ||
        !opt_int(bulk, "plan() bulk", &a.bulk, &a.bulk_given) ||
        !opt_int(context, "plan() context", &a.context, &context_given) ||
        !opt_int(overhead, "plan() block_overhead", &a.block_overhead, &a.overhead_given))
        return NULL;
    a.fit = context == Py_None; /* as Model(context=None): its own choice of context */
    a.bulk_is_fast_given = bulk_is_fast != NULL && bulk_is_fast != Py_None;
    if (a.bulk_is_fast_given && (a.bulk_is_fast = PyObject_IsTrue(bulk_is_fast)) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(image, &view, PyBUF_SIMPLE) != 0) return NULL;
    /* the engine reads the image 16-byte aligned: a buffer that is not is copied */
    uint8_t *copy = NULL;
    const uint8_t *data = view.buf;
    if (((uintptr_t)data & 15u) != 0) {
        copy = PyMem_Malloc((size_t)view.len + 16u);
        if (copy == NULL) return PyBuffer_Release(&view), PyErr_NoMemory();
        data = (const uint8_t *)llm_align_up((uintptr_t)copy, 16u);
        memcpy((uint8_t *)data, view.buf, (size_t)view.len);
    }
    PyObject *d = plan_of(module, data, (size_t)view.len, &a);
    PyMem_Free(copy);
    PyBuffer_Release(&view);
    return d;
}

static PyMethodDef module_methods[] = {
    {"selftest", mod_selftest, METH_NOARGS,
     "Every PIE kernel against its reference, and the silicon probes: a dict (and a "
     "summary line). On a PC the PIE kernels run through the host model."},
    {"plan", (PyCFunction)(void (*)(void))mod_plan, METH_VARARGS | METH_KEYWORDS,
     "plan(image, *, fast=None, bulk=None, context=0, plain=False, bulk_is_fast=None, "
     "block_overhead=None) -> dict: where opening the image would place every block, without "
     "opening it (opens, why, context, spilled, blocks)."},
    {"build_info", mod_build_info, METH_NOARGS,
     "Version, kernels (ref / pie / pie-emu), numerics mode and placement plan."},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module) {
    module_state *st = PyModule_GetState(module);
    st->error = PyErr_NewExceptionWithDoc(
        "_llm.Error", "An engine failure (bad image, checksum, context full, ...): the message "
        "starts with the status name, then says what was wrong.", PyExc_RuntimeError, NULL);
    PyObject *type = st->error ? PyType_FromModuleAndSpec(module, &Model_spec, NULL) : NULL;
    const int failed = type == NULL || PyModule_AddObjectRef(module, "Error", st->error) != 0 ||
                   PyModule_AddObjectRef(module, "Model", type) != 0 ||
                   PyModule_AddStringConstant(module, "__version__", LLM_VERSION) != 0 ||
                   PyModule_AddIntConstant(module, "MAX_TOP_K", LLM_BIND_MAX_TOP_K) != 0;
    Py_XDECREF(type);
    return failed ? -1 : 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    Py_VISIT(((module_state *)PyModule_GetState(module))->error);
    return 0;
}

static int module_clear(PyObject *module) {
    Py_CLEAR(((module_state *)PyModule_GetState(module))->error);
    return 0;
}

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_llm",
    .m_doc = "mpllm engine: a TinyStories model image run by the C engine.",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
};

PyMODINIT_FUNC PyInit__llm(void) { return PyModuleDef_Init(&module_def); }
