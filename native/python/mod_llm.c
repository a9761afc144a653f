/*
 * CPython `_llm`: the engine (llm.h) behind the Python API documented once in
 * firmware/modules/_llm.pyi, the same API the MicroPython `_llm` exposes.
 *
 * Thin glue in CPython's dialect: Python objects become the C values the
 * shared rules take (native/binding/llm_bind.h decides what is valid, what a
 * message says and which exception it is), the GIL is released around
 * compute, and a long prefill polls for Ctrl-C between passes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "llm.h"
#include "llm_bind.h"
#include "llm_names.h"
#include "port_host.h"
#include "selftest.h"

typedef struct {
    PyObject *error; /* _llm.Error */
} module_state;

typedef struct {
    PyObject_HEAD
    llm_engine *engine;
    llm_host_port port;  /* lives as long as the object: the engine points at it */
    llm_host_map map;    /* set when opened from a path */
    Py_buffer view;      /* set when opened from a bytes-like object */
    int have_view;
    void *copy;          /* aligned copy when the buffer was not 16-byte aligned */
    int busy;            /* a call is running with the GIL released */
    Py_ssize_t exports;  /* tokenizer() views alive: the image bytes stay until 0 */
    PyObject *error;     /* borrowed from the module state, kept alive by a ref */
} ModelObject;

/* ---- errors ------------------------------------------------------------ */

/* The one place a decision of llm_bind.h becomes a Python exception. */
static PyObject *raise_bind(PyObject *error_class, const llm_bind_error *e) {
    switch (e->kind) {
    case LLM_BIND_TYPE_ERROR: PyErr_SetString(PyExc_TypeError, e->message); break;
    case LLM_BIND_VALUE_ERROR: PyErr_SetString(PyExc_ValueError, e->message); break;
    case LLM_BIND_MEMORY_ERROR: PyErr_NoMemory(); break;
    case LLM_BIND_INTERRUPT:
        /* the poll found a signal: its handler's exception is already set */
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
        break;
    default: PyErr_SetString(error_class, e->message); break;
    }
    return NULL;
}

static PyObject *raise_llm(PyObject *error_class, const llm_error *err) {
    llm_bind_error e;
    llm_bind_status(err, &e);
    return raise_bind(error_class, &e);
}

static PyObject *raise_state(PyObject *error_class, const char *message) {
    llm_error err;
    err.status = LLM_E_STATE;
    snprintf(err.message, sizeof err.message, "%s", message);
    return raise_llm(error_class, &err);
}

/* An int argument for the shared rules: TypeError for anything else (bool
 * included: True is not a token id); too large either way is overflow. */
static int int_arg(PyObject *obj, const char *what, llm_bind_int *out) {
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return 0;
    }
    out->value = PyLong_AsLongLongAndOverflow(obj, &out->overflow);
    return !(out->value == -1 && PyErr_Occurred());
}

/* Polled by long prefills with the GIL released: runs Python's signal
 * handlers; nonzero (with their exception set) stops the prefill. */
static int poll_signals(void *ctx) {
    (void)ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = PyErr_CheckSignals() != 0;
    PyGILState_Release(g);
    return stop;
}

/* Shared entry check: open and not in use by another thread. */
static int ready(ModelObject *self) {
    if (self->engine == NULL) {
        raise_state(self->error, "the model is closed");
        return 0;
    }
    if (self->busy) {
        raise_state(self->error, "the model is in use by another thread");
        return 0;
    }
    return 1;
}

/* ---- lifetime ---------------------------------------------------------- */

/* The image bytes (mapping, view or copy): kept while a tokenizer() view
 * reads them, even after close(). */
static void release_image(ModelObject *self) {
    if (self->exports > 0) return;
    if (self->map.data != NULL) llm_host_unmap(&self->map);
    if (self->have_view) {
        PyBuffer_Release(&self->view);
        self->have_view = 0;
    }
    if (self->copy != NULL) {
        PyMem_RawFree(self->copy);
        self->copy = NULL;
    }
}

static void release(ModelObject *self) {
    if (self->engine != NULL) {
        llm_close(self->engine);
        self->engine = NULL;
    }
    release_image(self);
}

/* The buffer protocol exports the tokenizer section, read-only and in place
 * (tokenizer() is a memoryview of it): the view keeps this object, and so
 * the image bytes, alive. */
static int Model_getbuffer(ModelObject *self, Py_buffer *view, int flags) {
    if (!ready(self)) return -1;
    size_t len = 0;
    const uint8_t *p = llm_tokenizer(self->engine, &len);
    if (PyBuffer_FillInfo(view, (PyObject *)self, (void *)p, (Py_ssize_t)len, 1, flags) != 0)
        return -1;
    self->exports++;
    return 0;
}

static void Model_releasebuffer(ModelObject *self, Py_buffer *view) {
    (void)view;
    if (--self->exports == 0 && self->engine == NULL) release_image(self);
}

static void Model_dealloc(ModelObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    release(self);
    Py_CLEAR(self->error);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Model_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    ModelObject *self = (ModelObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->engine = NULL;
    self->map.data = NULL;
    self->map.len = 0;
    self->have_view = 0;
    self->copy = NULL;
    self->busy = 0;
    self->exports = 0;
    self->error = NULL;
    llm_port_host_init(&self->port);
    return (PyObject *)self;
}

static PyObject *find_error_class(PyTypeObject *type);

static int Model_init(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"image", "plain", "fast", NULL};
    PyObject *image;
    int plain = 0, fast = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$pp:Model", kwlist, &image, &plain, &fast))
        return -1;
    llm_bind_error be;
    if (llm_bind_modes(plain, fast, &be) != LLM_BIND_OK) {
        raise_bind(PyExc_ValueError, &be);
        return -1;
    }
    if (self->error == NULL) {
        self->error = find_error_class(Py_TYPE(self));
        if (self->error == NULL) return -1;
    }
    if (self->engine != NULL || self->busy || self->exports > 0) {
        PyErr_SetString(PyExc_TypeError, "Model.__init__ called twice");
        return -1;
    }
    const uint8_t *data;
    size_t len;
    if (PyUnicode_Check(image) || PyObject_HasAttrString(image, "__fspath__")) {
        PyObject *path = NULL;
        if (!PyUnicode_FSConverter(image, &path)) return -1;
        llm_error err;
        int sys_errno = 0;
        llm_status st;
        const char *cpath = PyBytes_AS_STRING(path);
        Py_BEGIN_ALLOW_THREADS
        st = llm_host_map_file(cpath, &self->map, &sys_errno, &err);
        Py_END_ALLOW_THREADS
        if (st != LLM_OK) {
            if (sys_errno != 0) {
                errno = sys_errno;
                PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, image);
            } else {
                raise_llm(self->error, &err);
            }
            Py_DECREF(path);
            return -1;
        }
        Py_DECREF(path);
        data = self->map.data;
        len = self->map.len;
    } else if (PyObject_CheckBuffer(image)) {
        if (PyObject_GetBuffer(image, &self->view, PyBUF_SIMPLE) != 0) return -1;
        self->have_view = 1;
        data = self->view.buf;
        len = (size_t)self->view.len;
        if (llm_bind_must_copy(data, len, self->view.readonly)) {
            uint8_t *raw = PyMem_RawMalloc(len + 16u);
            if (raw == NULL) {
                release(self);
                PyErr_NoMemory();
                return -1;
            }
            self->copy = raw;
            uint8_t *aligned = (uint8_t *)(((uintptr_t)raw + 15u) & ~(uintptr_t)15u);
            if (len > 0) memcpy(aligned, data, len); /* data may be NULL when empty */
            data = aligned;
            PyBuffer_Release(&self->view);
            self->have_view = 0;
        }
    } else {
        PyErr_Format(PyExc_TypeError,
                     "Model() takes a path (str or os.PathLike) or a bytes-like image, not %.100s",
                     Py_TYPE(image)->tp_name);
        return -1;
    }
    llm_error err;
    llm_status st;
    llm_engine *engine = NULL;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = llm_open(&engine, data, len, &self->port.port, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (st != LLM_OK) {
        release(self);
        raise_llm(self->error, &err);
        return -1;
    }
    llm_set_plain(engine, plain);
    llm_set_interrupt(engine, poll_signals, NULL);
    if (fast && llm_set_fast(engine, 1, &err) != LLM_OK) {
        llm_close(engine);
        release(self);
        raise_llm(self->error, &err);
        return -1;
    }
    self->engine = engine;
    return 0;
}

/* ---- methods ----------------------------------------------------------- */

static PyObject *Model_close(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) return raise_state(self->error, "the model is in use by another thread");
    release(self);
    Py_RETURN_NONE;
}

static PyObject *Model_enter(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Model_exit(ModelObject *self, PyObject *args) {
    (void)args;
    return Model_close(self, NULL);
}

static PyObject *Model_reset(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    llm_reset(self->engine);
    Py_RETURN_NONE;
}

static PyObject *Model_pos(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return PyLong_FromUnsignedLong(llm_pos(self->engine));
}

static PyObject *Model_rewind(ModelObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    llm_bind_int v;
    if (!int_arg(arg, "rewind() position", &v)) return NULL;
    if (!ready(self)) return NULL; /* __index__ is user code */
    uint32_t pos;
    llm_bind_error be;
    if (llm_bind_rewind(self->engine, v, &pos, &be) != LLM_BIND_OK)
        return raise_bind(self->error, &be);
    llm_error err;
    if (llm_rewind(self->engine, pos, &err) != LLM_OK) return raise_llm(self->error, &err);
    Py_RETURN_NONE;
}

static int set_item(PyObject *dict, const char *key, PyObject *value) {
    if (value == NULL) return -1;
    int r = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *Model_config(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    const llm_config *c = llm_get_config(self->engine);
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    llm_bind_field f[LLM_BIND_CONFIG_INTS];
    llm_bind_config(self->engine, f);
    for (size_t i = 0; i < LLM_BIND_CONFIG_INTS; i++)
        if (set_item(d, f[i].name, PyLong_FromUnsignedLongLong(f[i].value)) != 0) goto fail;
    if (set_item(d, "rope_theta", PyFloat_FromDouble(c->rope_theta)) != 0) goto fail;
    if (set_item(d, "tied_head", PyBool_FromLong(c->flags & 1u)) != 0) goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *Model_sampler(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"temperature", "top_k", "seed", NULL};
    double temperature = 0.0;
    PyObject *top_k_obj = NULL, *seed_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|dOO:sampler", kwlist, &temperature,
                                     &top_k_obj, &seed_obj))
        return NULL;
    llm_bind_int top_k = {0, 0}, seed = {0, 0};
    if (top_k_obj != NULL && !int_arg(top_k_obj, "top_k", &top_k)) return NULL;
    if (seed_obj != NULL) {
        llm_bind_int probe;
        if (!int_arg(seed_obj, "seed", &probe)) return NULL;
        /* a u64: its bits, or which way it fell outside 0..2**64-1 */
        unsigned long long u = PyLong_AsUnsignedLongLong(seed_obj);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            seed.overflow = probe.value < 0 || probe.overflow < 0 ? -1 : 1;
        } else {
            seed.value = (int64_t)u;
        }
    }
    /* __float__ / __index__ above are user code: check the model after them */
    if (!ready(self)) return NULL;
    llm_sampler_options opt;
    llm_bind_error be;
    if (llm_bind_sampler(self->engine, temperature, top_k, seed, &opt, &be) != LLM_BIND_OK)
        return raise_bind(self->error, &be);
    llm_error err;
    if (llm_set_sampler(self->engine, &opt, &err) != LLM_OK) return raise_llm(self->error, &err);
    Py_RETURN_NONE;
}

/* A token argument: an int in the embedding's range, else TypeError/ValueError. */
static int token_arg(ModelObject *self, PyObject *obj, int32_t *out) {
    llm_bind_int v;
    if (!int_arg(obj, "a token id", &v)) return 0;
    llm_bind_error be;
    if (llm_bind_token(self->engine, v, out, &be) != LLM_BIND_OK) {
        raise_bind(self->error, &be);
        return 0;
    }
    return 1;
}

/* A sequence of token ids as a fresh array (PyMem_Free it), or NULL with an
 * exception. Iterating `tokens` runs user code, which may close the model:
 * the open check is repeated after it, before the engine's config is read. */
static int32_t *tokens_arg(ModelObject *self, PyObject *tokens, const char *name,
                           Py_ssize_t min_n, Py_ssize_t max_n, Py_ssize_t *n_out) {
    char what[64];
    snprintf(what, sizeof what, "%s takes a sequence of token ids", name);
    PyObject *seq = PySequence_Fast(tokens, what);
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t *ids = NULL;
    if (!ready(self)) goto done;
    llm_bind_error be;
    if (llm_bind_count(name, (size_t)n, (size_t)min_n, (size_t)max_n, &be) != LLM_BIND_OK) {
        raise_bind(self->error, &be);
        goto done;
    }
    ids = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!token_arg(self, items[i], &ids[i])) {
            PyMem_Free(ids);
            ids = NULL;
            goto done;
        }
    }
    *n_out = n;
done:
    Py_DECREF(seq);
    return ids;
}

static PyObject *Model_prefill(ModelObject *self, PyObject *args) {
    PyObject *tokens;
    if (!PyArg_ParseTuple(args, "O:prefill", &tokens)) return NULL;
    if (!ready(self)) return NULL;
    Py_ssize_t n = 0;
    /* a prompt longer than the context is the engine's "context full" */
    int32_t *ids = tokens_arg(self, tokens, "prefill()", 1, (Py_ssize_t)(UINT32_MAX / 2u), &n);
    if (ids == NULL) return NULL;
    llm_error err;
    llm_status st;
    int32_t next = 0;
    llm_engine *engine = self->engine;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = llm_prefill(engine, ids, (uint32_t)n, &next, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyMem_Free(ids);
    if (st != LLM_OK) return raise_llm(self->error, &err);
    return PyLong_FromLong(next);
}

static PyObject *Model_draft(ModelObject *self, PyObject *args) {
    PyObject *context, *max_obj;
    if (!PyArg_ParseTuple(args, "OO:draft", &context, &max_obj)) return NULL;
    if (!ready(self)) return NULL;
    llm_bind_int max_len;
    uint32_t want;
    llm_bind_error be;
    if (!int_arg(max_obj, "draft() max_len", &max_len)) return NULL;
    if (llm_bind_draft_len(max_len, &want, &be) != LLM_BIND_OK)
        return raise_bind(self->error, &be);
    Py_ssize_t n = 0;
    int32_t *ids = tokens_arg(self, context, "draft()", 0, (Py_ssize_t)(UINT32_MAX / 2u), &n);
    if (ids == NULL) return NULL;
    int32_t out[LLM_BIND_MAX_DRAFT];
    uint32_t got = llm_draft(self->engine, ids, (uint32_t)n, want, out);
    PyMem_Free(ids);
    PyObject *list = PyList_New((Py_ssize_t)got);
    if (list == NULL) return NULL;
    for (uint32_t i = 0; i < got; i++) {
        PyObject *v = PyLong_FromLong(out[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyObject *Model_verify(ModelObject *self, PyObject *tokens) {
    if (!ready(self)) return NULL;
    Py_ssize_t n = 0;
    int32_t *ids = tokens_arg(self, tokens, "verify()", 1, (Py_ssize_t)LLM_VERIFY_MAX, &n);
    if (ids == NULL) return NULL;
    int32_t next[LLM_VERIFY_MAX];
    llm_error err;
    llm_status st;
    llm_engine *engine = self->engine;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = llm_verify(engine, ids, (uint32_t)n, next, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyMem_Free(ids);
    if (st != LLM_OK) return raise_llm(self->error, &err);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(next[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *Model_step(ModelObject *self, PyObject *args) {
    PyObject *tok;
    if (!PyArg_ParseTuple(args, "O:step", &tok)) return NULL;
    if (!ready(self)) return NULL;
    int32_t id;
    if (!token_arg(self, tok, &id)) return NULL;
    llm_error err;
    llm_status st;
    int32_t next = 0;
    llm_engine *engine = self->engine;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = llm_step(engine, id, &next, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (st != LLM_OK) return raise_llm(self->error, &err);
    return PyLong_FromLong(next);
}

static PyObject *Model_logits(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    const float *l = llm_logits(self->engine);
    if (l == NULL) return raise_state(self->error, "no logits yet: call prefill() or step() first");
    /* both supported hosts are little-endian, as the engine checks at open */
    return PyBytes_FromStringAndSize((const char *)l,
                                     (Py_ssize_t)llm_get_config(self->engine)->vocab_out * 4);
}

static PyObject *Model_tokenizer(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyObject *Model_stats(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    llm_stats s;
    llm_get_stats(self->engine, &s);
    PyObject *d = PyDict_New(), *ms = NULL, *bytes = NULL;
    if (d == NULL) return NULL;
    llm_bind_field f[LLM_BIND_STATS_INTS];
    llm_bind_stats(&s, f);
    for (size_t i = 0; i < LLM_BIND_STATS_INTS; i++)
        if (set_item(d, f[i].name, PyLong_FromUnsignedLongLong(f[i].value)) != 0) goto fail;
    if (set_item(d, "ttft_ms", PyFloat_FromDouble(llm_bind_ttft_ms(&s))) != 0) goto fail;
    if ((ms = PyDict_New()) == NULL || (bytes = PyDict_New()) == NULL) goto fail;
    for (int i = 0; i < LLM_STAGE_COUNT; i++)
        if (set_item(ms, llm_stage_name((llm_stage)i),
                     PyFloat_FromDouble(llm_bind_stage_ms(&s, (llm_stage)i))) != 0)
            goto fail;
    if (PyDict_SetItemString(d, "stage_ms", ms) != 0) goto fail;
    if (set_item(d, "total_ms", PyFloat_FromDouble(llm_bind_total_ms(&s))) != 0) goto fail;
    for (int r = 0; r < LLM_REGION_COUNT; r++)
        if (set_item(bytes, llm_region_name((llm_region)r),
                     PyLong_FromUnsignedLongLong(s.bytes[r])) != 0)
            goto fail;
    if (PyDict_SetItemString(d, "bytes", bytes) != 0) goto fail;
    Py_DECREF(ms);
    Py_DECREF(bytes);
    return d;
fail:
    Py_XDECREF(ms);
    Py_XDECREF(bytes);
    Py_DECREF(d);
    return NULL;
}

static PyObject *Model_set_plain(ModelObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    int on = PyObject_IsTrue(arg);
    if (on < 0 || !ready(self)) return NULL; /* __bool__ is user code */
    llm_bind_error be;
    if (llm_bind_set_plain(self->engine, on, &be) != LLM_BIND_OK)
        return raise_bind(self->error, &be);
    llm_set_plain(self->engine, on);
    Py_RETURN_NONE;
}

static PyObject *Model_set_fast(ModelObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    int on = PyObject_IsTrue(arg);
    if (on < 0 || !ready(self)) return NULL; /* __bool__ is user code */
    llm_error err;
    if (llm_set_fast(self->engine, on, &err) != LLM_OK) return raise_llm(self->error, &err);
    Py_RETURN_NONE;
}

static PyObject *Model_fast(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return PyBool_FromLong(llm_fast(self->engine));
}

static PyObject *Model_plain(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return PyBool_FromLong(llm_plain(self->engine));
}

static PyObject *Model_memory(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    uint32_t n = llm_placement_count(self->engine);
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        const llm_placement *p = llm_placement_at(self->engine, i);
        PyObject *t = Py_BuildValue("(ssk)", p->name, llm_region_name(p->region),
                                    (unsigned long)p->bytes);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

static PyMethodDef Model_methods[] = {
    {"config", (PyCFunction)Model_config, METH_NOARGS, "Model dimensions as a dict."},
    {"reset", (PyCFunction)Model_reset, METH_NOARGS, "Back to position 0 (stats cleared)."},
    {"sampler", (PyCFunction)(void (*)(void))Model_sampler, METH_VARARGS | METH_KEYWORDS,
     "sampler(temperature=0.0, top_k=0, seed=0): choose how next tokens are picked."},
    {"prefill", (PyCFunction)Model_prefill, METH_VARARGS,
     "prefill(tokens) -> next token: run the prompt, head on the last token only."},
    {"step", (PyCFunction)Model_step, METH_VARARGS, "step(token) -> next token."},
    {"verify", (PyCFunction)Model_verify, METH_O,
     "verify(tokens) -> the next token after each prefix, one pass (speculative decoding)."},
    {"logits", (PyCFunction)Model_logits, METH_NOARGS,
     "float32 little-endian logits of the last head evaluation, as bytes."},
    {"tokenizer", (PyCFunction)Model_tokenizer, METH_NOARGS, "The image's tokenizer section."},
    {"pos", (PyCFunction)Model_pos, METH_NOARGS, "Current position (tokens in the context)."},
    {"draft", (PyCFunction)Model_draft, METH_VARARGS,
     "draft(context, max_len): up to max_len guesses from the image's n-gram table "
     "(for verify)."},
    {"rewind", (PyCFunction)Model_rewind, METH_O,
     "rewind(pos): drop positions >= pos; decoding goes on as if they were never decoded."},
    {"stats", (PyCFunction)Model_stats, METH_NOARGS,
     "Timing per stage (ms), token counts, TTFT and bytes read per region since reset."},
    {"memory", (PyCFunction)Model_memory, METH_NOARGS,
     "[(name, region, bytes)]: where each section and buffer was placed."},
    {"set_plain", (PyCFunction)Model_set_plain, METH_O,
     "set_plain(on): every speed-up off (dense head, no core split); same results."},
    {"plain", (PyCFunction)Model_plain, METH_NOARGS, "Whether plain mode is on."},
    {"set_fast", (PyCFunction)Model_set_fast, METH_O,
     "set_fast(on): attention over an int8 KV cache (LOSSY, opt-in); at position 0 only."},
    {"fast", (PyCFunction)Model_fast, METH_NOARGS, "Whether fast (lossy) mode is on."},
    {"close", (PyCFunction)Model_close, METH_NOARGS, "Release the model (idempotent)."},
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
    {Py_tp_doc, "Model(image, *, plain=False): an mpllm model image, from a path "
                "(memory-mapped) or a bytes-like object (kept alive until close); plain turns "
                "every speed-up off (same results)."},
    {0, NULL},
};

static PyType_Spec Model_spec = {
    .name = "_llm.Model",
    .basicsize = sizeof(ModelObject),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Model_slots,
};

/* ---- module ------------------------------------------------------------ */

typedef struct {
    PyObject *lines;
    llm_bind_selftest sum;
    int failed; /* a Python error while collecting */
} selftest_acc;

static void selftest_line(void *user, const char *line) {
    selftest_acc *acc = user;
    llm_bind_selftest_line(&acc->sum, line);
    PyObject *s = PyUnicode_FromString(line);
    if (s == NULL || PyList_Append(acc->lines, s) != 0) acc->failed = 1;
    Py_XDECREF(s);
}

static PyObject *mod_selftest(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    selftest_acc acc = {PyList_New(0), {{0}, 0, 0, 0, 0}, 0};
    if (acc.lines == NULL) return NULL;
    llm_selftest_run(selftest_line, &acc);
    if (acc.failed) {
        Py_DECREF(acc.lines);
        return NULL;
    }
    const llm_bind_selftest *t = &acc.sum;
    PySys_WriteStdout("selftest (kernels=%s): %u kernel checks passed, %u failed; %u probes, "
                      "%u differ from the host model\n", t->kernels, (unsigned)t->passed,
                      (unsigned)t->failures, (unsigned)t->probes,
                      (unsigned)t->probe_differences);
    return Py_BuildValue("{s:s,s:I,s:I,s:I,s:I,s:O,s:N}", "kernels", t->kernels, "passed",
                         t->passed, "failures", t->failures, "probes", t->probes,
                         "probe_differences", t->probe_differences, "ok",
                         t->failures == 0 ? Py_True : Py_False, "lines", acc.lines);
}

static PyObject *mod_build_info(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyUnicode_FromString(llm_build_info());
}

static PyMethodDef module_methods[] = {
    {"selftest", mod_selftest, METH_NOARGS,
     "Every PIE kernel against its reference, and the silicon probes: a dict (and a "
     "summary line). On a PC the PIE kernels run through the host model."},
    {"build_info", mod_build_info, METH_NOARGS,
     "Version, kernels (ref / pie / pie-emu), numerics mode and placement plan."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def;

static PyObject *find_error_class(PyTypeObject *type) {
    /* Model is not subclassable, so its type is the one made from module_def */
    PyObject *module = PyType_GetModule(type);
    if (module == NULL) return NULL;
    module_state *st = PyModule_GetState(module);
    Py_INCREF(st->error);
    return st->error;
}

static int module_exec(PyObject *module) {
    module_state *st = PyModule_GetState(module);
    st->error = PyErr_NewExceptionWithDoc(
        "_llm.Error",
        "An engine failure (bad image, checksum, context full, ...). The message starts "
        "with the status name, then says what was wrong.",
        PyExc_RuntimeError, NULL);
    if (st->error == NULL) return -1;
    if (PyModule_AddObjectRef(module, "Error", st->error) != 0) return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &Model_spec, NULL);
    if (type == NULL) return -1;
    if (PyModule_AddObject(module, "Model", type) != 0) {
        Py_DECREF(type);
        return -1;
    }
    if (PyModule_AddStringConstant(module, "__version__", LLM_VERSION) != 0) return -1;
    if (PyModule_AddIntConstant(module, "MAX_TOP_K", LLM_BIND_MAX_TOP_K) != 0) return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
    module_state *st = PyModule_GetState(module);
    Py_VISIT(st->error);
    return 0;
}

static int module_clear(PyObject *module) {
    module_state *st = PyModule_GetState(module);
    Py_CLEAR(st->error);
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

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
