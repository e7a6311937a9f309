/*
 * slot_fields(cls): a NamedTuple's field getters as member descriptors (speedups.h lists the
 * extension's files).
 *
 * ``typing.NamedTuple`` reads a field through ``collections._tuplegetter``, a descriptor CPython's
 * attribute specialization does not know: every ``record.value`` takes the generic lookup (type
 * lookup, descriptor call), several times the cost of ``record[6]``.  A member descriptor
 * (``PyMemberDef``, ``T_OBJECT_EX``) at the offset of the tuple's item ``i`` gives the same value,
 * and the interpreter specializes it to one load (LOAD_ATTR_SLOT), as it does for ``__slots__``
 * and for C struct sequences such as ``os.stat_result``, which are laid out the same way.
 *
 * This is sound because every instance of the class has all its fields: the NamedTuple's
 * ``__new__``, ``_make``, pickle and copy all build full tuples, and so does the decoder.  Only
 * ``tuple.__new__(cls, shorter)`` called directly, which the NamedTuple contract does not allow,
 * could make a shorter one; the class is checked to add nothing to tuple's layout.
 */

#include "speedups.h"

#include <string.h>
#include <structmember.h>

static char *
copy_utf8(PyObject *text)
{
    const char *utf8 = PyUnicode_AsUTF8(text);
    if (utf8 == NULL) {
        return NULL;
    }
    size_t len = strlen(utf8) + 1;
    char *copy = PyMem_Malloc(len);
    if (copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(copy, utf8, len);
    return copy;
}

PyObject *
slot_fields(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "slot_fields: expected a NamedTuple class");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)arg;
    if (!plain_tuple_subclass(cls)) {
        PyErr_SetString(PyExc_TypeError, "slot_fields: the class must be a tuple subclass without extra fields");
        return NULL;
    }
    PyObject *fields = PyObject_GetAttr(arg, s_fields);
    if (fields == NULL) {
        return NULL;
    }
    if (!PyTuple_Check(fields)) {
        Py_DECREF(fields);
        PyErr_SetString(PyExc_TypeError, "slot_fields: _fields must be a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    /* The definitions live as long as the class (a module-level class: the process). */
    PyMemberDef *defs = PyMem_Calloc((size_t)n + 1, sizeof(PyMemberDef));
    if (defs == NULL) {
        Py_DECREF(fields);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "slot_fields: _fields must hold str");
            goto fail;
        }
        PyObject *old = PyObject_GetAttr(arg, name);
        PyObject *doc = old == NULL ? NULL : PyObject_GetAttrString(old, "__doc__");
        Py_XDECREF(old);
        if (doc == NULL) {
            goto fail;
        }
        defs[i].name = copy_utf8(name);
        defs[i].doc = PyUnicode_Check(doc) ? copy_utf8(doc) : NULL;
        int failed = defs[i].name == NULL || (PyUnicode_Check(doc) && defs[i].doc == NULL);
        Py_DECREF(doc);
        if (failed) {
            goto fail;
        }
        defs[i].type = T_OBJECT_EX;
        defs[i].offset = offsetof(PyTupleObject, ob_item) + (Py_ssize_t)sizeof(PyObject *) * i;
        defs[i].flags = READONLY;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *descr = PyDescr_NewMember(cls, &defs[i]);
        if (descr == NULL) {
            goto fail;
        }
        int failed = PyObject_SetAttr(arg, PyTuple_GET_ITEM(fields, i), descr);
        Py_DECREF(descr);
        if (failed < 0) {
            goto fail; /* the fields set so far read the same values: the class stays usable */
        }
    }
    Py_DECREF(fields);
    Py_RETURN_NONE;
fail:
    /* defs is not freed: a descriptor installed before the failure may point at it. */
    Py_DECREF(fields);
    return NULL;
}
