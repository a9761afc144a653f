/*
 * The CPython `_llm`'s two halves (mod_llm.c: the module and the Model type;
 * mod_llm_call.c: Python objects to the binding core's values and back,
 * around one generic method call).
 */
#ifndef MPLLM_MOD_LLM_CALL_H
#define MPLLM_MOD_LLM_CALL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "llm_bind.h"
#include "port_host.h"

typedef struct {
    PyObject *error; /* _llm.Error */
} module_state;

typedef struct {
    PyObject_HEAD
    llm_bind_model m;
    llm_host_port port; /* m.port points into it: lives as long as the object */
    llm_host_map map;   /* set when opened from a path */
    Py_buffer view;     /* set when a bytes-like object is used in place */
    int have_view;
    Py_ssize_t exports; /* tokenizer() views alive: the image bytes stay until 0 */
    PyObject *error;    /* the module's _llm.Error */
} ModelObject;

/* Set what the core decided (an llm_bind_error) as its Python exception;
 * returns NULL. */
PyObject *raise_bind(PyObject *error_class, const llm_bind_error *e);
/* Open and not in use by another thread; else 0 with the error set. */
int ready(ModelObject *self);
/* Model.<method>(*args, **kwds) for the core's method `id`. */
PyObject *call(ModelObject *self, llm_bind_method_id id, PyObject *args, PyObject *kwds);
/* Polled by long prefills with the GIL released (llm_bind_open's poll). */
int poll_signals(void *ctx);
/* An int as the core reads it (bool refused; u64: its 64 bits); 0 with the
 * exception set when it is not one. */
int int_arg(PyObject *obj, const char *what, int u64, llm_bind_int *out);
/* _llm.plan()'s dict (llm_bind_plan_result). */
PyObject *plan_dict(const llm_bind_plan_out *out);
/* selftest()'s dict: the core's summary (NULL with an exception on failure). */
PyObject *selftest_dict(const llm_bind_selftest *t);

#endif
