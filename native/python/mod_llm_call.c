/* Python objects to the binding core's values and back (mod_llm_call.h). */
#include "mod_llm_call.h"

/* OSError(errno, message), exactly OSError as on MicroPython (which has no
 * subclasses): built from the message alone, because OSError(errno, ...)
 * would become FileNotFoundError and the like; then errno, strerror and args
 * as OSError(errno, message) has them. */
static void raise_os_error(const llm_bind_error *e) {
    PyObject *message = PyUnicode_FromString(e->message);
    PyObject *exc = message == NULL ? NULL : PyObject_CallOneArg(PyExc_OSError, message);
    PyObject *args = exc == NULL ? NULL : Py_BuildValue("(iO)", e->sys_errno, message);
    PyObject *code = args == NULL ? NULL : PyLong_FromLong(e->sys_errno);
    if (code != NULL && PyObject_SetAttrString(exc, "args", args) == 0 &&
        PyObject_SetAttrString(exc, "errno", code) == 0 &&
        PyObject_SetAttrString(exc, "strerror", message) == 0)
        PyErr_SetObject(PyExc_OSError, exc);
    Py_XDECREF(code);
    Py_XDECREF(args);
    Py_XDECREF(exc);
    Py_XDECREF(message);
}

/* The one place a decision of the core becomes a Python exception. */
PyObject *raise_bind(PyObject *error_class, const llm_bind_error *e) {
    switch (e->kind) {
    case LLM_BIND_TYPE_ERROR: PyErr_SetString(PyExc_TypeError, e->message); break;
    case LLM_BIND_VALUE_ERROR: PyErr_SetString(PyExc_ValueError, e->message); break;
    case LLM_BIND_INDEX_ERROR: PyErr_SetString(PyExc_IndexError, e->message); break;
    case LLM_BIND_OS_ERROR: raise_os_error(e); break;
    case LLM_BIND_MEMORY_ERROR: PyErr_NoMemory(); break;
    case LLM_BIND_INTERRUPT:
        /* the poll found a signal: its handler's exception is already set */
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
        break;
    default: PyErr_SetString(error_class, e->message); break;
    }
    return NULL;
}

/* Open and not in use (by another thread, or by the call building a result). */
int ready(ModelObject *self) {
    llm_bind_error e;
    if (llm_bind_ready(&self->m, &e) != LLM_BIND_OK) {
        raise_bind(self->error, &e);
        return 0;
    }
    return 1;
}

/* An int as the core reads it (bool refused); a U64 as its 64 bits. */
int int_arg(PyObject *obj, const char *what, int u64, llm_bind_int *out) {
    llm_bind_error e;
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        llm_bind_not_int(what, Py_TYPE(obj)->tp_name, &e);
        raise_bind(NULL, &e);
        return 0;
    }
    out->value = PyLong_AsLongLongAndOverflow(obj, &out->overflow);
    if (out->value == -1 && PyErr_Occurred()) return 0;
    if (out->overflow) out->value = 0; /* the core reads value only when it fits */
    if (u64 && (out->overflow != 0 || out->value < 0)) {
        const int negative = out->overflow < 0 || (out->overflow == 0 && out->value < 0);
        unsigned long long bits = PyLong_AsUnsignedLongLong(obj);
        out->overflow = 0;
        out->value = (int64_t)bits;
        if (bits == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            out->overflow = negative ? -1 : 1;
        }
    }
    return 1;
}

/* Polled by long prefills with the GIL released: runs Python's signal
 * handlers; nonzero (with their exception set) stops the prefill. */
int poll_signals(void *ctx) {
    (void)ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = PyErr_CheckSignals() != 0;
    PyGILState_Release(g);
    return stop;
}

/* ---- return values: the core's values as objects ----------------------- */

typedef struct {
    PyObject *at[LLM_BIND_MAX_DEPTH + 1]; /* the return value, then the containers in it */
} builder;

static int put(void *ctx, const llm_bind_value *v) {
    builder *b = ctx;
    PyObject *o;
    switch (v->type) {
    case LLM_BIND_INT: o = PyLong_FromLongLong(v->i); break;
    case LLM_BIND_FLOAT: o = PyFloat_FromDouble(v->f); break;
    case LLM_BIND_BOOL: o = PyBool_FromLong((long)v->i); break;
    case LLM_BIND_STR: o = PyUnicode_FromStringAndSize(v->p, (Py_ssize_t)v->n); break;
    case LLM_BIND_BYTES: o = PyBytes_FromStringAndSize(v->p, (Py_ssize_t)v->n); break;
    case LLM_BIND_LIST: o = PyList_New((Py_ssize_t)v->n); break;
    case LLM_BIND_TUPLE: o = PyTuple_New((Py_ssize_t)v->n); break;
    case LLM_BIND_DICT: o = PyDict_New(); break;
    default: o = Py_NewRef(Py_None); break;
    }
    if (o == NULL) return 0;
    PyObject *in = v->depth > 0 ? b->at[v->depth - 1] : NULL;
    b->at[v->depth] = o; /* borrowed below the top: the container owns it */
    if (in == NULL) return 1;
    if (PyList_Check(in)) {
        PyList_SET_ITEM(in, (Py_ssize_t)v->index, o); /* steals o */
        return 1;
    }
    if (PyTuple_Check(in)) {
        PyTuple_SET_ITEM(in, (Py_ssize_t)v->index, o);
        return 1;
    }
    const int stored = PyDict_SetItemString(in, v->key, o) == 0;
    Py_DECREF(o);
    return stored;
}

static PyObject *result(builder *b, int good) {
    if (!good) Py_XDECREF(b->at[0]);
    return good ? b->at[0] : NULL;
}

/* ---- methods: one generic call, the core's table says the arguments ----- */

PyObject *call(ModelObject *self, llm_bind_method_id id, PyObject *args, PyObject *kwds) {
    const llm_bind_method *meth = llm_bind_method_at(id);
    const Py_ssize_t max = LLM_BIND_MAX_PARAMS, n_pos = PyTuple_GET_SIZE(args);
    PyObject *vals[2 * LLM_BIND_MAX_PARAMS], *key, *value, *seq[LLM_BIND_MAX_PARAMS] = {NULL};
    const char *names[LLM_BIND_MAX_PARAMS];
    for (Py_ssize_t i = 0; i < n_pos && i < max; i++) vals[i] = PyTuple_GET_ITEM(args, i);
    Py_ssize_t n_kw = 0, it = 0;
    while (kwds != NULL && PyDict_Next(kwds, &it, &key, &value)) {
        if (n_kw < max && (names[n_kw] = PyUnicode_AsUTF8(key)) == NULL) return NULL;
        if (n_kw < max) vals[max + n_kw] = value;
        n_kw++;
    }
    int slot[LLM_BIND_MAX_PARAMS];
    llm_bind_error e;
    if (llm_bind_match(meth, (size_t)n_pos, names, (size_t)n_kw, slot, &e) != LLM_BIND_OK)
        return raise_bind(self->error, &e);
    /* a closed model says so first; then what may run user code (iterating,
     * __float__, __bool__), which may close it; the open check again; then
     * the ids against the engine */
    if (!ready(self)) return NULL;
    llm_bind_arg a[LLM_BIND_MAX_PARAMS] = {{0}};
    int32_t *ids[LLM_BIND_MAX_PARAMS] = {NULL};
    uint8_t *bits[LLM_BIND_MAX_PARAMS] = {NULL};
    PyObject *ret = NULL;
    for (int j = 0; j < meth->n_params; j++) {
        const llm_bind_param *p = &meth->params[j];
        PyObject *o = slot[j] < 0 ? NULL : vals[slot[j]];
        if (p->or_none && o == Py_None) o = NULL;
        if (!(a[j].given = o != NULL)) continue;
        if (p->kind == LLM_BIND_P_FLOAT) {
            if ((a[j].f = PyFloat_AsDouble(o)) == -1.0 && PyErr_Occurred()) goto done;
        } else if (p->kind == LLM_BIND_P_BOOL) {
            if ((a[j].on = PyObject_IsTrue(o)) < 0) goto done;
        } else if (p->kind == LLM_BIND_P_BITS) {
            /* copied: the engine reads it with the GIL released, when another
             * thread could change the caller's buffer */
            Py_buffer view;
            if (!PyObject_CheckBuffer(o)) {
                llm_bind_not_bits(p->what, Py_TYPE(o)->tp_name, &e);
                raise_bind(self->error, &e);
                goto done;
            }
            if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) != 0) goto done;
            bits[j] = PyMem_Malloc(view.len > 0 ? (size_t)view.len : 1u);
            if (bits[j] != NULL) memcpy(bits[j], view.buf, (size_t)view.len);
            a[j].bits = bits[j];
            a[j].n = (size_t)view.len;
            PyBuffer_Release(&view);
            if (bits[j] == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        } else if (p->kind == LLM_BIND_P_TOKENS) {
            /* the core's message replaces only "not iterable" */
            llm_bind_not_tokens(p->what, Py_TYPE(o)->tp_name, &e);
            if ((seq[j] = PySequence_Fast(o, e.message)) == NULL) goto done;
        } else if (!int_arg(o, p->what, p->kind == LLM_BIND_P_U64, &a[j].i)) {
            goto done;
        }
    }
    if (!ready(self)) goto done;
    for (int j = 0; j < meth->n_params; j++) {
        if (seq[j] == NULL) continue;
        a[j].n = (size_t)PySequence_Fast_GET_SIZE(seq[j]);
        if (llm_bind_tokens(&self->m, &meth->params[j], a[j].n, &e) != LLM_BIND_OK) {
            raise_bind(self->error, &e);
            goto done;
        }
        if ((a[j].ids = ids[j] = PyMem_Malloc((a[j].n + 1) * sizeof(int32_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (size_t i = 0; i < a[j].n; i++) {
            llm_bind_int v;
            if (!int_arg(PySequence_Fast_ITEMS(seq[j])[i], "a token id", 0, &v)) goto done;
            if (llm_bind_token(&self->m, &meth->params[j], v, &ids[j][i], &e) != LLM_BIND_OK) {
                raise_bind(self->error, &e);
                goto done;
            }
        }
    }
    llm_bind_out out;
    llm_bind_kind kind;
    /* busy until the result is built: its allocations may run a finaliser that
     * would close the model under the engine call or the result's reads */
    self->m.busy = 1;
    if (meth->computes) {
        Py_BEGIN_ALLOW_THREADS
        kind = llm_bind_call(&self->m, id, a, &out, &e);
        Py_END_ALLOW_THREADS
    } else {
        kind = llm_bind_call(&self->m, id, a, &out, &e);
    }
    if (kind == LLM_BIND_OK) {
        builder b = {{NULL}};
        const llm_bind_sink sink = {put, &b};
        ret = result(&b, llm_bind_result(&self->m, id, &out, &sink));
    }
    self->m.busy = 0;
    if (kind != LLM_BIND_OK) raise_bind(self->error, &e);
done:
    for (int j = 0; j < LLM_BIND_MAX_PARAMS; j++) {
        Py_XDECREF(seq[j]);
        PyMem_Free(ids[j]);
        PyMem_Free(bits[j]);
    }
    return ret;
}

PyObject *selftest_dict(const llm_bind_selftest *t) {
    builder b = {{NULL}};
    const llm_bind_sink sink = {put, &b};
    return result(&b, llm_bind_selftest_result(t, &sink));
}

PyObject *plan_dict(const llm_bind_plan_out *out) {
    builder b = {{NULL}};
    const llm_bind_sink sink = {put, &b};
    return result(&b, llm_bind_plan_result(out, &sink));
}
