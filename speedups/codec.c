/*
 * decode_message(programs, view): Kafka protocol messages (headers and bodies) parsed to plain
 * dicts, the compiled twin of protocol/messages.py's MessageStruct._parse (speedups.h lists the
 * extension's files).
 *
 * The layout is not written here: protocol/messages.py compiles each MessageStruct, itself built
 * from Kafka's JSON message definitions, into a program of plain tuples (MessageStruct.program()
 * says what each holds), and this file walks the program over the frame.  A struct's program is
 * ``(template, steps, tagged, fill)``: the dict of defaults every result starts from, the
 * positional fields as ``(key, node)`` in wire order, the tagged fields as ``{tag: (key, node)}``
 * (None in a version that is not flexible) and ``(key, factory)`` for the mutable defaults of the
 * fields the wire did not carry.  A node is ``(op, flags, sub)``: one of the ops below, F_FLEXIBLE
 * and F_NULLABLE, and for an array its element's node, for a struct its program.
 *
 * It answers only for well-formed input: on anything it cannot read (a length past the end, a
 * null where none is allowed, invalid UTF-8, a Python error) it returns None, and the caller runs
 * the Python decoder on the same frame, which raises the error that names the field (or, if it
 * reads the frame after all, answers).  So every message this returns is one the Python decoder
 * returns too, with the same keys and values: tests/protocol/test_codec_compiled.py checks it on
 * every message and version, and on garbage.
 */

#include "speedups.h"

enum op {
    OP_BOOL = 0,
    OP_INT8 = 1,
    OP_INT16 = 2,
    OP_INT32 = 3,
    OP_INT64 = 4,
    OP_UINT16 = 5,
    OP_UINT32 = 6,
    OP_FLOAT64 = 7,
    OP_UUID = 8,
    OP_STRING = 9,
    OP_BYTES = 10,
    OP_RECORDS = 11,
    OP_ARRAY = 12,
    OP_STRUCT = 13,
    OP_NULLABLE_STRUCT = 14,
};

#define F_FLEXIBLE 1
#define F_NULLABLE 2

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end;
    PyObject *view; /* the frame's memoryview: records are slices of it */
} reader;

/* What every failure returns: NULL, an exception set or not (the caller clears it either way). */
#define FAIL NULL

static inline int
has(const reader *r, int64_t n)
{
    return n >= 0 && n <= (int64_t)(r->end - r->pos);
}

/* An unsigned LEB128 varint of at most 5 bytes (lengths, counts, tags), as read_uvarint reads it. */
static inline int
uvarint(reader *r, int64_t *out)
{
    uint64_t result = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (r->pos >= r->end) {
            return -1;
        }
        unsigned int b = r->buf[r->pos++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)result;
            return 0;
        }
    }
    return -1;
}

static inline uint16_t
be_u16(const unsigned char *p)
{
    return (uint16_t)(((unsigned int)p[0] << 8) | (unsigned int)p[1]);
}

/* A length or count: a compact varint less one (flexible), else an int32 (``wide``) or int16. */
static inline int
length(reader *r, int flags, int wide, int64_t *out)
{
    if (flags & F_FLEXIBLE) {
        int64_t n;
        if (uvarint(r, &n) < 0) {
            return -1;
        }
        *out = n - 1;
        return 0;
    }
    if (wide) {
        if (!has(r, 4)) {
            return -1;
        }
        *out = (int32_t)be_u32(r->buf + r->pos);
        r->pos += 4;
        return 0;
    }
    if (!has(r, 2)) {
        return -1;
    }
    *out = (int16_t)be_u16(r->buf + r->pos);
    r->pos += 2;
    return 0;
}

/* -1: a null the field allows (the value is None), 0: not null, 1: invalid. */
static inline int
null_or_not(int64_t n, int flags)
{
    if (n >= 0) {
        return 0;
    }
    return (n == -1 && (flags & F_NULLABLE)) ? -1 : 1;
}

static PyObject *parse_struct(reader *r, PyObject *program);

static PyObject *
parse_node(reader *r, PyObject *node)
{
    long op = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    int flags = (int)PyLong_AsLong(PyTuple_GET_ITEM(node, 1));
    const unsigned char *p = r->buf + r->pos;
    int64_t n;
    switch (op) {
    case OP_BOOL:
        if (!has(r, 1)) {
            return FAIL;
        }
        r->pos += 1;
        return PyBool_FromLong(p[0] != 0);
    case OP_INT8:
        if (!has(r, 1)) {
            return FAIL;
        }
        r->pos += 1;
        return PyLong_FromLong((int8_t)p[0]);
    case OP_INT16:
        if (!has(r, 2)) {
            return FAIL;
        }
        r->pos += 2;
        return PyLong_FromLong((int16_t)be_u16(p));
    case OP_UINT16:
        if (!has(r, 2)) {
            return FAIL;
        }
        r->pos += 2;
        return PyLong_FromLong(be_u16(p));
    case OP_INT32:
        if (!has(r, 4)) {
            return FAIL;
        }
        r->pos += 4;
        return PyLong_FromLong((int32_t)be_u32(p));
    case OP_UINT32:
        if (!has(r, 4)) {
            return FAIL;
        }
        r->pos += 4;
        return PyLong_FromUnsignedLong(be_u32(p));
    case OP_INT64:
        if (!has(r, 8)) {
            return FAIL;
        }
        r->pos += 8;
        return PyLong_FromLongLong(be_i64(p));
    case OP_FLOAT64: {
        if (!has(r, 8)) {
            return FAIL;
        }
        r->pos += 8;
        uint64_t bits = (uint64_t)be_i64(p);
        double d;
        memcpy(&d, &bits, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case OP_UUID:
        if (!has(r, 16)) {
            return FAIL;
        }
        r->pos += 16;
        return PyBytes_FromStringAndSize((const char *)p, 16);
    case OP_STRING:
    case OP_BYTES:
    case OP_RECORDS: {
        if (length(r, flags, op != OP_STRING, &n) < 0) {
            return FAIL;
        }
        int null = null_or_not(n, flags);
        if (null) {
            return null < 0 ? Py_NewRef(Py_None) : FAIL;
        }
        if (!has(r, n)) {
            return FAIL;
        }
        Py_ssize_t start = r->pos;
        r->pos += (Py_ssize_t)n;
        if (op == OP_STRING) {
            return PyUnicode_DecodeUTF8((const char *)r->buf + start, (Py_ssize_t)n, NULL);
        }
        if (op == OP_BYTES) {
            return PyBytes_FromStringAndSize((const char *)r->buf + start, (Py_ssize_t)n);
        }
        return PySequence_GetSlice(r->view, start, start + (Py_ssize_t)n); /* a view, no copy */
    }
    case OP_ARRAY: {
        if (length(r, flags, 1, &n) < 0) {
            return FAIL;
        }
        int null = null_or_not(n, flags);
        if (null) {
            return null < 0 ? Py_NewRef(Py_None) : FAIL;
        }
        if (n > (int64_t)(r->end - r->pos)) { /* every element takes a byte at least */
            return FAIL;
        }
        PyObject *element = PyTuple_GET_ITEM(node, 2);
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL) {
            return FAIL;
        }
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *item = parse_node(r, element);
            if (item == NULL) {
                Py_DECREF(list);
                return FAIL;
            }
            PyList_SET_ITEM(list, i, item);
        }
        return list;
    }
    case OP_STRUCT:
        return parse_struct(r, PyTuple_GET_ITEM(node, 2));
    case OP_NULLABLE_STRUCT:
        if (!has(r, 1)) {
            return FAIL;
        }
        r->pos += 1;
        if (p[0] >= 0x80) { /* a negative int8: null */
            return Py_NewRef(Py_None);
        }
        return parse_struct(r, PyTuple_GET_ITEM(node, 2));
    default:
        PyErr_Format(PyExc_ValueError, "decode_message: unknown op %ld", op);
        return FAIL;
    }
}

/* Set ``key`` of ``result`` to what ``node`` reads: 0, or -1 on failure. */
static inline int
set_parsed(reader *r, PyObject *result, PyObject *key, PyObject *node)
{
    PyObject *value = parse_node(r, node);
    if (value == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(result, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *
parse_struct(reader *r, PyObject *program)
{
    PyObject *template = PyTuple_GET_ITEM(program, 0);
    PyObject *steps = PyTuple_GET_ITEM(program, 1);
    PyObject *tagged = PyTuple_GET_ITEM(program, 2);
    PyObject *fill = PyTuple_GET_ITEM(program, 3);
    PyObject *seen = NULL; /* keys of the tagged fields read, made when the first one is */
    PyObject *result = PyDict_Copy(template);
    if (result == NULL) {
        return FAIL;
    }
    Py_ssize_t nsteps = PyTuple_GET_SIZE(steps);
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i);
        if (set_parsed(r, result, PyTuple_GET_ITEM(step, 0), PyTuple_GET_ITEM(step, 1)) < 0) {
            goto fail;
        }
    }
    if (tagged != Py_None) {
        int64_t count;
        if (uvarint(r, &count) < 0) {
            goto fail;
        }
        for (int64_t i = 0; i < count; i++) {
            int64_t tag, size;
            if (uvarint(r, &tag) < 0 || uvarint(r, &size) < 0) {
                goto fail;
            }
            PyObject *tag_obj = PyLong_FromLongLong(tag);
            if (tag_obj == NULL) {
                goto fail;
            }
            PyObject *known = PyDict_GetItemWithError(tagged, tag_obj); /* borrowed */
            Py_DECREF(tag_obj);
            if (known == NULL) {
                if (PyErr_Occurred() || !has(r, size)) {
                    goto fail;
                }
                r->pos += (Py_ssize_t)size; /* unknown tags are how new fields appear */
                continue;
            }
            PyObject *key = PyTuple_GET_ITEM(known, 0);
            Py_ssize_t start = r->pos;
            if (set_parsed(r, result, key, PyTuple_GET_ITEM(known, 1)) < 0) {
                goto fail;
            }
            int64_t used = (int64_t)(r->pos - start);
            if (used > size || !has(r, size - used)) {
                goto fail;
            }
            r->pos += (Py_ssize_t)(size - used);
            if (seen == NULL && (seen = PySet_New(NULL)) == NULL) {
                goto fail;
            }
            if (PySet_Add(seen, key) < 0) {
                goto fail;
            }
        }
    }
    Py_ssize_t nfill = PyTuple_GET_SIZE(fill);
    for (Py_ssize_t i = 0; i < nfill; i++) {
        PyObject *entry = PyTuple_GET_ITEM(fill, i);
        PyObject *key = PyTuple_GET_ITEM(entry, 0);
        if (seen != NULL) {
            int in = PySet_Contains(seen, key);
            if (in < 0) {
                goto fail;
            }
            if (in) {
                continue;
            }
        }
        PyObject *value = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, 1));
        if (value == NULL) {
            goto fail;
        }
        int rc = PyDict_SetItem(result, key, value);
        Py_DECREF(value);
        if (rc < 0) {
            goto fail;
        }
    }
    Py_XDECREF(seen);
    return result;
fail:
    Py_XDECREF(seen);
    Py_DECREF(result);
    return FAIL;
}

PyObject *
decode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyMemoryView_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_message(programs: tuple, view: memoryview)");
        return NULL;
    }
    PyObject *programs = args[0];
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[1], &buffer, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    reader r = {(const unsigned char *)buffer.buf, 0, buffer.len, args[1]};
    Py_ssize_t n = PyTuple_GET_SIZE(programs);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyBuffer_Release(&buffer);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *body = parse_struct(&r, PyTuple_GET_ITEM(programs, i));
        if (body == NULL) {
            /* Not answered here: the Python decoder reads the frame again and names what is wrong. */
            PyErr_Clear();
            Py_DECREF(out);
            PyBuffer_Release(&buffer);
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, body);
    }
    PyBuffer_Release(&buffer);
    return out;
}
