/*
 * The Arrow C data interface, and int32_steps (speedups.h lists the extension's files): the column
 * builder's buffers (columns.c) handed to pyarrow without a copy.
 */

#include "speedups.h"

/* ------------------------------------------------------------------ the Arrow C data interface
 *
 * export_arrow(node) hands a tree of column buffers to Arrow in one call: a PyCapsule named
 * "arrow_array" holding a ``struct ArrowArray`` (the Arrow C data interface, its ABI fixed by
 * the Arrow project), which pyarrow's ``RecordBatch._import_from_c`` imports from its address
 * (arrow_address) against a schema object, or ``pyarrow.record_batch`` together with a schema's
 * capsule (the PyCapsule protocol, ``__arrow_c_array__``).  A node is ``(format, length, null_count,
 * offset, buffers, children)``: ``format`` the Arrow format string of its physical layout (see
 * export_check, which holds the buffers to it), ``buffers`` a tuple of objects with the buffer
 * protocol (or None for an absent validity bitmap), ``children`` a tuple of nodes.  Each buffer is held (a Py_buffer, as
 * memoryview holds one) until Arrow releases the array, from whatever thread it is in: the
 * release callback takes the GIL to let go of them.  Nothing is copied. */

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define EXPORT_MAX_DEPTH 16
#define EXPORT_MAX_WIDTH 4096

/* One node's memory: its Py_buffers, the pointers Arrow reads, and its children's structs. */
typedef struct {
    Py_ssize_t held; /* views[0:held] are acquired */
    Py_buffer *views;
    const void **pointers;
    Py_ssize_t *sizes; /* each buffer's bytes, -1 for None */
    struct ArrowArray **child_pointers;
    struct ArrowArray *children;
} export_private;

static void
export_free(export_private *priv)
{
    PyMem_RawFree(priv->views);
    PyMem_RawFree(priv->pointers);
    PyMem_RawFree(priv->sizes);
    PyMem_RawFree(priv->child_pointers);
    PyMem_RawFree(priv->children);
    PyMem_RawFree(priv);
}

/* Let go of an array's children and buffers; the GIL is held. */
static void
export_release_held(struct ArrowArray *array)
{
    export_private *priv = array->private_data;
    for (int64_t i = 0; i < array->n_children; i++) {
        struct ArrowArray *child = array->children[i];
        if (child->release != NULL) { /* NULL: Arrow moved the child out (and released it itself) */
            export_release_held(child);
        }
    }
    for (Py_ssize_t i = 0; i < priv->held; i++) {
        PyBuffer_Release(&priv->views[i]);
    }
    export_free(priv);
    array->release = NULL;
}

static int
export_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static void
export_release(struct ArrowArray *array)
{
    if (array->release == NULL) {
        return;
    }
    if (!Py_IsInitialized() || export_finalizing()) {
        /* The interpreter is gone, or going: taking the GIL now could end this thread (an Arrow
         * thread, perhaps).  Its objects go with it; the buffers are left held. */
        array->release = NULL;
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    export_release_held(array);
    PyGILState_Release(gil);
}

static int
export_int(PyObject *obj, const char *what, int64_t lowest, int64_t *out)
{
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < lowest) {
        PyErr_Format(PyExc_ValueError, "export_arrow: %s %lld is below %lld", what, v, (long long)lowest);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* The int32 at index ``i`` of an offsets buffer. */
static int32_t
export_offset_at(const void *buf, int64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)buf + i * 4, 4);
    return v;
}

/* What Arrow's validate() checks of a node (the cheap part: sizes and the ends of offsets, not
 * each offset), against the layout its format gives: "z"/"u" binary and UTF-8 (validity, int32
 * offsets, data), "i"/"l" 4- and 8-byte values, "+l" a list (validity, int32 offsets, one
 * child), "+s" a struct (validity, children).  ``sizes``: each buffer's bytes, -1 for None.
 * Importing through the C data interface checks none of it: a wrong size would be read past. */
static int
export_check(const char *fmt, const struct ArrowArray *a, const Py_ssize_t *sizes)
{
    int64_t nb = a->n_buffers, nc = a->n_children, end;
    int binary = strcmp(fmt, "z") == 0 || strcmp(fmt, "u") == 0, list = strcmp(fmt, "+l") == 0;
    int width = strcmp(fmt, "i") == 0 ? 4 : strcmp(fmt, "l") == 0 ? 8 : 0, strct = strcmp(fmt, "+s") == 0;
    if (!binary && !list && !width && !strct) {
        PyErr_Format(PyExc_ValueError, "export_arrow: unknown format '%s' (z, u, i, l, +l or +s)", fmt);
        return -1;
    }
    int64_t want_buffers = binary ? 3 : strct ? 1 : 2;
    if (nb != want_buffers || (list && nc != 1) || ((binary || width) && nc != 0)) {
        PyErr_Format(PyExc_ValueError, "export_arrow: a %s node has %lld buffers and %lld children", fmt,
                     (long long)nb, (long long)nc);
        return -1;
    }
    if (a->offset > INT64_MAX - a->length - 1 || (end = a->offset + a->length) > INT64_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "export_arrow: offset + length is too large");
        return -1;
    }
    if (a->null_count > a->length || (sizes[0] < 0 && a->null_count != 0)) {
        PyErr_Format(PyExc_ValueError, "export_arrow: null_count %lld with length %lld%s", (long long)a->null_count,
                     (long long)a->length, sizes[0] < 0 ? " and no validity bitmap" : "");
        return -1;
    }
    const char *short_buffer = NULL;
    if (sizes[0] >= 0 && sizes[0] < (end + 7) / 8) {
        short_buffer = "validity bitmap";
    }
    for (int64_t i = 1; i < nb && short_buffer == NULL; i++) {
        if (sizes[i] < 0) {
            PyErr_Format(PyExc_ValueError, "export_arrow: buffer %lld of a %s node is None", (long long)i, fmt);
            return -1;
        }
    }
    int64_t last = 0;
    if (short_buffer == NULL && width && sizes[1] < end * width) {
        short_buffer = "values";
    }
    else if (short_buffer == NULL && (binary || list)) {
        if (sizes[1] < (end + 1) * 4) {
            short_buffer = "offsets";
        }
        else {
            int32_t first = export_offset_at(a->buffers[1], a->offset);
            last = export_offset_at(a->buffers[1], end);
            if (first < 0 || last < first) {
                PyErr_Format(PyExc_ValueError, "export_arrow: a %s node's offsets run from %d to %d", fmt, (int)first,
                             (int)last);
                return -1;
            }
            if (binary && sizes[2] < last) {
                short_buffer = "data";
            }
        }
    }
    if (short_buffer != NULL) {
        PyErr_Format(PyExc_ValueError, "export_arrow: the %s buffer of a %s node of %lld values from %lld is too short",
                     short_buffer, fmt, (long long)a->length, (long long)a->offset);
        return -1;
    }
    for (int64_t i = 0; i < nc; i++) {
        const struct ArrowArray *child = a->children[i];
        int64_t need = list ? last : end;
        if (child->offset + child->length < need) {
            PyErr_Format(PyExc_ValueError, "export_arrow: child %lld of a %s node has %lld values, it needs %lld",
                         (long long)i, fmt, (long long)(child->offset + child->length), (long long)need);
            return -1;
        }
    }
    return 0;
}

/* Fill ``array`` from ``node``; on failure ``array->release`` stays NULL and nothing is held. */
static int
export_node(PyObject *node, struct ArrowArray *array, int depth)
{
    memset(array, 0, sizeof(*array));
    if (depth > EXPORT_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "export_arrow: nodes nested too deeply");
        return -1;
    }
    if (!PyTuple_Check(node) || PyTuple_GET_SIZE(node) != 6 || !PyUnicode_Check(PyTuple_GET_ITEM(node, 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(node, 4)) || !PyTuple_Check(PyTuple_GET_ITEM(node, 5))) {
        PyErr_SetString(PyExc_TypeError,
                        "export_arrow: a node is a tuple (format, length, null_count, offset, buffers, children): "
                        "format a str, buffers and children tuples");
        return -1;
    }
    const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(node, 0));
    if (fmt == NULL) {
        return -1;
    }
    PyObject *buffers = PyTuple_GET_ITEM(node, 4), *children = PyTuple_GET_ITEM(node, 5);
    Py_ssize_t nb = PyTuple_GET_SIZE(buffers), nc = PyTuple_GET_SIZE(children);
    if (nb > EXPORT_MAX_WIDTH || nc > EXPORT_MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "export_arrow: a node with too many buffers or children");
        return -1;
    }
    if (export_int(PyTuple_GET_ITEM(node, 1), "length", 0, &array->length) < 0 ||
        export_int(PyTuple_GET_ITEM(node, 2), "null_count", -1, &array->null_count) < 0 ||
        export_int(PyTuple_GET_ITEM(node, 3), "offset", 0, &array->offset) < 0) {
        return -1;
    }
    export_private *priv = PyMem_RawCalloc(1, sizeof(export_private));
    if (priv == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* calloc(0) may return NULL: ask for at least one of each. */
    priv->views = PyMem_RawCalloc((size_t)(nb ? nb : 1), sizeof(Py_buffer));
    priv->pointers = PyMem_RawCalloc((size_t)(nb ? nb : 1), sizeof(void *));
    priv->sizes = PyMem_RawCalloc((size_t)(nb ? nb : 1), sizeof(Py_ssize_t));
    priv->child_pointers = PyMem_RawCalloc((size_t)(nc ? nc : 1), sizeof(struct ArrowArray *));
    priv->children = PyMem_RawCalloc((size_t)(nc ? nc : 1), sizeof(struct ArrowArray));
    if (priv->views == NULL || priv->pointers == NULL || priv->sizes == NULL || priv->child_pointers == NULL ||
        priv->children == NULL) {
        export_free(priv);
        PyErr_NoMemory();
        return -1;
    }
    array->n_buffers = nb;
    array->n_children = 0; /* counts the children built: the ones a failure must let go of */
    array->buffers = priv->pointers;
    array->children = priv->child_pointers;
    array->private_data = priv;
    array->release = export_release;
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *item = PyTuple_GET_ITEM(buffers, i);
        priv->sizes[i] = -1;
        if (item == Py_None) {
            priv->pointers[i] = NULL;
            continue;
        }
        Py_buffer *view = &priv->views[priv->held];
        if (PyObject_GetBuffer(item, view, PyBUF_SIMPLE) < 0) {
            goto fail;
        }
        priv->held++;
        priv->pointers[i] = view->buf;
        priv->sizes[i] = view->len;
    }
    for (Py_ssize_t i = 0; i < nc; i++) {
        priv->child_pointers[i] = &priv->children[i];
        if (export_node(PyTuple_GET_ITEM(children, i), &priv->children[i], depth + 1) < 0) {
            goto fail; /* this one holds nothing; the ones before are whole */
        }
        array->n_children = i + 1;
    }
    if (export_check(fmt, array, priv->sizes) < 0) {
        goto fail;
    }
    return 0;
fail:
    export_release_held(array);
    return -1;
}

static void
export_capsule_free(PyObject *capsule)
{
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array == NULL) {
        PyErr_Clear();
        return;
    }
    if (array->release != NULL) { /* not imported: ours to release (the GIL is held here) */
        export_release_held(array);
    }
    PyMem_RawFree(array);
}

PyObject *
export_arrow(PyObject *module, PyObject *node)
{
    struct ArrowArray *array = PyMem_RawMalloc(sizeof(struct ArrowArray));
    if (array == NULL) {
        return PyErr_NoMemory();
    }
    if (export_node(node, array, 0) < 0) {
        PyMem_RawFree(array);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(array, "arrow_array", export_capsule_free);
    if (capsule == NULL) {
        export_release_held(array);
        PyMem_RawFree(array);
    }
    return capsule;
}

/* The address of the struct ArrowArray in an export_arrow capsule, for pyarrow's
 * ``RecordBatch._import_from_c(address, schema)``, which takes a Schema object: importing through
 * the PyCapsule protocol exports and imports the schema again for every batch. */
PyObject *
arrow_address(PyObject *module, PyObject *capsule)
{
    if (!PyCapsule_IsValid(capsule, "arrow_array")) {
        PyErr_SetString(PyExc_TypeError, "arrow_address: not an export_arrow capsule");
        return NULL;
    }
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array->release == NULL) {
        PyErr_SetString(PyExc_ValueError, "arrow_address: the array was imported already");
        return NULL;
    }
    return PyLong_FromVoidPtr(array);
}

/* int32_steps(count, step) -> bytearray: count int32 values 0, step, 2 * step, ... */
PyObject *
int32_steps(PyObject *module, PyObject *args)
{
    Py_ssize_t count;
    int step;
    if (!PyArg_ParseTuple(args, "ni:int32_steps", &count, &step)) {
        return NULL;
    }
    if (count < 0 || (count > 1 && (step < 0 || (int64_t)step * (count - 1) > INT32_MAX))) {
        PyErr_Format(PyExc_ValueError, "int32_steps(%zd, %d): the values must be int32 and not negative", count, step);
        return NULL;
    }
    if (count > PY_SSIZE_T_MAX / 4) { /* a step of 0 bounds no count */
        return PyErr_NoMemory();
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * 4);
    if (out == NULL) {
        return NULL;
    }
    char *p = PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t v = (int32_t)(i * step);
        memcpy(p + i * 4, &v, 4);
    }
    return out;
}

