/*
 * ready(value): an awaitable that is already complete.  ``await ready(x)`` is ``x`` without a
 * coroutine: no frame, no suspension, no event-loop turn.  Consumer.__anext__ returns one for a
 * record it already holds, where a coroutine would cost a frame per record
 * (app/iterators.py picks this or its pure-Python twin ``ready_py``).
 *
 * The object is its own iterator: ``await`` drives it through am_send (PEP 590's PyIter_Send,
 * which returns the value without raising StopIteration); ``__next__`` and ``send`` raise
 * StopIteration(value) as a coroutine that returns would, and ``throw`` raises what it is given.
 * It is done after one step, like a coroutine: a second step raises RuntimeError.
 */

#include "speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *value; /* NULL once handed out */
} Ready;

static void
ready_dealloc(Ready *self)
{
    Py_XDECREF(self->value);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
ready_await(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

/* The value, handed out once (a reference the caller owns), or NULL with RuntimeError. */
static PyObject *
take(Ready *self)
{
    PyObject *value = self->value;
    if (value == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited ready()");
        return NULL;
    }
    self->value = NULL;
    return value;
}

static PySendResult
ready_send(PyObject *self, PyObject *arg, PyObject **result)
{
    (void)arg;
    PyObject *value = take((Ready *)self);
    if (value == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    *result = value;
    return PYGEN_RETURN;
}

/* StopIteration(value), as a returning coroutine raises it (a tuple value wrapped, so that it
 * arrives whole). */
static PyObject *
stop_with(PyObject *value)
{
    if (value == NULL) {
        return NULL;
    }
    PyObject *exc = PyObject_CallOneArg(PyExc_StopIteration, value);
    Py_DECREF(value);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_StopIteration, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static PyObject *
ready_next(PyObject *self)
{
    return stop_with(take((Ready *)self));
}

static PyObject *
ready_send_method(PyObject *self, PyObject *arg)
{
    (void)arg;
    return stop_with(take((Ready *)self));
}

static PyObject *
ready_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    Py_CLEAR(((Ready *)self)->value);
    PyObject *exc = args[0];
    if (PyExceptionInstance_Check(exc)) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    } else if (PyExceptionClass_Check(exc)) {
        PyErr_SetObject(exc, nargs > 1 ? args[1] : NULL);
    } else {
        PyErr_SetString(PyExc_TypeError, "exceptions must be classes or instances deriving from BaseException");
    }
    return NULL;
}

static PyObject *
ready_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_CLEAR(((Ready *)self)->value);
    Py_RETURN_NONE;
}

static PyMethodDef ready_methods[] = {
    {"send", (PyCFunction)ready_send_method, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))ready_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)ready_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods ready_async = {
    .am_await = ready_await,
    .am_send = ready_send,
};

PyTypeObject ReadyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncconsumer._speedups.Ready",
    .tp_doc = "An awaitable that is already complete: await gives its value (see ready()).",
    .tp_basicsize = sizeof(Ready),
    .tp_dealloc = (destructor)ready_dealloc,
    .tp_as_async = &ready_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = ready_next,
    .tp_methods = ready_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

PyObject *
ready(PyObject *module, PyObject *value)
{
    (void)module;
    Ready *self = PyObject_New(Ready, &ReadyType);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(value);
    self->value = value;
    return (PyObject *)self;
}
