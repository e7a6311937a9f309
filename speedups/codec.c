/*
 * decode_message(programs, view): Kafka protocol messages (headers and bodies) parsed to plain
 * dicts, the compiled twin of protocol/messages.py's MessageStruct._parse; encode_message(programs,
 * bodies, prefix) the twin of MessageStruct._build for plain bodies (speedups.h lists the
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
 * The decoder answers only for well-formed input: on anything it cannot read (a length past the end, a
 * null where none is allowed, invalid UTF-8, a Python error) it returns None, and the caller runs
 * the Python decoder on the same frame, which raises the error that names the field (or, if it
 * reads the frame after all, answers).  So every message this returns is one the Python decoder
 * returns too, with the same keys and values: tests/protocol/test_codec_compiled.py checks it on
 * every message and version, and on garbage.
 *
 * The encoder writes only what is plain: dicts with str keys that this version knows, no tagged
 * fields given (the Python encoder decides whether those are written), a field the version lacks
 * only if it is ignorable or its value is its default (an int or str equal to it, an empty array,
 * or the default object itself: the Python encoder drops those, and refuses or drops any other),
 * values of exactly the types the decoder returns (bool, int in range, float, str, bytes,
 * bytearray or memoryview, list or tuple, dict, None where allowed).
 * For anything else it returns None and the Python encoder writes the body, or raises the error
 * that names the field.  The same test checks both write the same bytes.
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

/* The bytes of each fixed-width op, OP_BOOL to OP_UUID. */
static const Py_ssize_t FIXED_SIZE[] = {1, 1, 2, 4, 8, 2, 4, 8, 16};

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
    if (op >= OP_BOOL && op <= OP_UUID) { /* fixed width: the bytes are there, or nothing is read */
        if (!has(r, FIXED_SIZE[op])) {
            return FAIL;
        }
        r->pos += FIXED_SIZE[op];
    }
    switch (op) {
    case OP_BOOL:
        return PyBool_FromLong(p[0] != 0);
    case OP_INT8:
        return PyLong_FromLong((int8_t)p[0]);
    case OP_INT16:
        return PyLong_FromLong((int16_t)be_u16(p));
    case OP_UINT16:
        return PyLong_FromLong(be_u16(p));
    case OP_INT32:
        return PyLong_FromLong((int32_t)be_u32(p));
    case OP_UINT32:
        return PyLong_FromUnsignedLong(be_u32(p));
    case OP_INT64:
        return PyLong_FromLongLong(be_i64(p));
    case OP_FLOAT64: {
        uint64_t bits = (uint64_t)be_i64(p);
        double d;
        memcpy(&d, &bits, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case OP_UUID:
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

/* ------------------------------------------------------------------ encode_message */

/* The bytes written so far (grown by doubling). */
typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
} writer;

static int
reserve(writer *w, Py_ssize_t n)
{
    if (w->len + n <= w->cap) {
        return 0;
    }
    Py_ssize_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *grown = PyMem_Realloc(w->buf, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->buf = grown;
    w->cap = cap;
    return 0;
}

static inline int
put(writer *w, const void *data, Py_ssize_t n)
{
    if (reserve(w, n) < 0) {
        return -1;
    }
    memcpy(w->buf + w->len, data, (size_t)n);
    w->len += n;
    return 0;
}

static inline int
put_be(writer *w, uint64_t value, int size)
{
    unsigned char out[8];
    for (int i = 0; i < size; i++) {
        out[i] = (unsigned char)(value >> (8 * (size - 1 - i)));
    }
    return put(w, out, size);
}

/* An unsigned varint of at most 32 bits, as write_uvarint writes it (-1: out of range). */
static int
put_uvarint(writer *w, int64_t value)
{
    if (value < 0 || value > 0xFFFFFFFFLL) {
        return -1;
    }
    unsigned char out[5];
    int n = 0;
    uint64_t v = (uint64_t)value;
    while (v > 0x7F) {
        out[n++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[n++] = (unsigned char)v;
    return put(w, out, n);
}

/* A length or count (or -1 for null): a compact varint of one more (flexible), else an int32
 * (``wide``) or an int16 (-1: it does not fit). */
static int
put_length(writer *w, int flags, int wide, int64_t n)
{
    if (flags & F_FLEXIBLE) {
        return put_uvarint(w, n + 1);
    }
    if (wide) {
        if (n > INT32_MAX) {
            return -1;
        }
        return put_be(w, (uint64_t)(uint32_t)(int32_t)n, 4);
    }
    if (n > 0x7FFF) {
        return -1;
    }
    return put_be(w, (uint64_t)(uint16_t)(int16_t)n, 2);
}

/* An int in [lo, hi], big-endian in ``size`` bytes (-1: not an int, or out of range). */
static int
put_int(writer *w, PyObject *value, long long lo, long long hi, int size)
{
    if (!PyLong_Check(value)) {
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()) || v < lo || v > hi) {
        return -1;
    }
    return put_be(w, (uint64_t)v, size);
}

static int encode_struct(writer *w, PyObject *program, PyObject *obj);

/* 0, or -1 where the Python encoder must answer (a value it may take that this does not, or an
 * error it raises with the field's name). */
static int
encode_node(writer *w, PyObject *node, PyObject *value)
{
    long op = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    int flags = (int)PyLong_AsLong(PyTuple_GET_ITEM(node, 1));
    switch (op) {
    case OP_BOOL: {
        if (value != Py_True && value != Py_False) {
            return -1;
        }
        unsigned char b = value == Py_True;
        return put(w, &b, 1);
    }
    case OP_INT8:
        return put_int(w, value, INT8_MIN, INT8_MAX, 1);
    case OP_INT16:
        return put_int(w, value, INT16_MIN, INT16_MAX, 2);
    case OP_UINT16:
        return put_int(w, value, 0, UINT16_MAX, 2);
    case OP_INT32:
        return put_int(w, value, INT32_MIN, INT32_MAX, 4);
    case OP_UINT32:
        return put_int(w, value, 0, UINT32_MAX, 4);
    case OP_INT64:
        return put_int(w, value, INT64_MIN, INT64_MAX, 8);
    case OP_FLOAT64: {
        if (!PyFloat_CheckExact(value)) {
            return -1;
        }
        double d = PyFloat_AS_DOUBLE(value);
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return put_be(w, bits, 8);
    }
    case OP_UUID:
        if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) != 16) {
            return -1;
        }
        return put(w, PyBytes_AS_STRING(value), 16);
    case OP_STRING: {
        if (value == Py_None) {
            return (flags & F_NULLABLE) ? put_length(w, flags, 0, -1) : -1;
        }
        if (!PyUnicode_CheckExact(value)) {
            return -1;
        }
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(value, &n);
        if (utf8 == NULL || put_length(w, flags, 0, n) < 0) {
            return -1;
        }
        return put(w, utf8, n);
    }
    case OP_BYTES:
    case OP_RECORDS: {
        if (value == Py_None) {
            return (flags & F_NULLABLE) ? put_length(w, flags, 1, -1) : -1;
        }
        if (!PyBytes_CheckExact(value) && !PyByteArray_CheckExact(value) && !PyMemoryView_Check(value)) {
            return -1;
        }
        Py_buffer view;
        if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0) {
            return -1;
        }
        int rc = put_length(w, flags, 1, view.len) < 0 ? -1 : put(w, view.buf, view.len);
        PyBuffer_Release(&view);
        return rc;
    }
    case OP_ARRAY: {
        if (value == Py_None) {
            return (flags & F_NULLABLE) ? put_length(w, flags, 1, -1) : -1;
        }
        if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) {
            return -1;
        }
        PyObject *element = PyTuple_GET_ITEM(node, 2);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
        if (put_length(w, flags, 1, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            /* Read again each time, and held while written: the list is the caller's. */
            if (i >= PySequence_Fast_GET_SIZE(value)) {
                return -1;
            }
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(value, i));
            int rc = encode_node(w, element, item);
            Py_DECREF(item);
            if (rc < 0) {
                return -1;
            }
        }
        return 0;
    }
    case OP_STRUCT:
        return PyDict_CheckExact(value) ? encode_struct(w, PyTuple_GET_ITEM(node, 2), value) : -1;
    case OP_NULLABLE_STRUCT: {
        unsigned char marker = value == Py_None ? 0xFF : 0x01;
        if ((marker == 0x01 && !PyDict_CheckExact(value)) || put(w, &marker, 1) < 0) {
            return -1;
        }
        return marker == 0xFF ? 0 : encode_struct(w, PyTuple_GET_ITEM(node, 2), value);
    }
    default:
        return -1;
    }
}

/* Whether a field this version lacks may be in the body at ``value`` (``spec`` is its program's
 * ``(key, ignorable, default)``): it is ignorable, or its value is its default (the object itself,
 * an empty list or tuple for an array, or an int or str of the default's exact type equal to it).
 * Anything else is for the Python encoder to drop or refuse.  1 yes, 0 no, -1 error. */
static int
absent_may_go(PyObject *spec, PyObject *value)
{
    PyObject *dflt = PyTuple_GET_ITEM(spec, 2);
    if (PyTuple_GET_ITEM(spec, 1) == Py_True || value == dflt) {
        return 1;
    }
    if (PyTuple_CheckExact(dflt) && PyTuple_GET_SIZE(dflt) == 0) { /* an array's default: empty */
        return (PyList_CheckExact(value) && PyList_GET_SIZE(value) == 0) ||
               (PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 0);
    }
    if (Py_TYPE(value) != Py_TYPE(dflt) || !(PyLong_CheckExact(value) || PyUnicode_CheckExact(value))) {
        return 0;
    }
    return PyObject_RichCompareBool(value, dflt, Py_EQ);
}

/* A struct's fields from the dict ``obj`` (its program: see MessageStruct.program()). Only the
 * plain case: every key known to this version, a field this version lacks only where the Python
 * encoder would drop it (absent_may_go; it is not written), none of the tagged ones given (the
 * Python encoder decides whether those are written). */
static int
encode_struct(writer *w, PyObject *program, PyObject *obj)
{
    PyObject *steps = PyTuple_GET_ITEM(program, 1);
    PyObject *tagged = PyTuple_GET_ITEM(program, 2);
    PyObject *all_keys = PyTuple_GET_ITEM(program, 4);
    PyObject *absent = PyTuple_GET_ITEM(program, 5);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        /* Keys of exact str only: comparing them runs no Python code while the dict is walked. */
        int known = PyUnicode_CheckExact(key) ? PySet_Contains(all_keys, key) : -1;
        if (known <= 0) {
            return -1;
        }
    }
    Py_ssize_t nabsent = PyTuple_GET_SIZE(absent);
    for (Py_ssize_t i = 0; i < nabsent; i++) {
        PyObject *spec = PyTuple_GET_ITEM(absent, i);
        PyObject *given = PyDict_GetItemWithError(obj, PyTuple_GET_ITEM(spec, 0)); /* borrowed */
        if (given == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        if (absent_may_go(spec, given) != 1) {
            return -1;
        }
    }
    Py_ssize_t nsteps = PyTuple_GET_SIZE(steps);
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i);
        value = PyDict_GetItemWithError(obj, PyTuple_GET_ITEM(step, 0)); /* borrowed */
        if (value == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            value = PyTuple_GET_ITEM(step, 2); /* the field's default */
        }
        if (encode_node(w, PyTuple_GET_ITEM(step, 1), value) < 0) {
            return -1;
        }
    }
    if (tagged != Py_None) {
        pos = 0;
        PyObject *tag, *entry;
        while (PyDict_Next(tagged, &pos, &tag, &entry)) {
            int in = PyDict_Contains(obj, PyTuple_GET_ITEM(entry, 0));
            if (in != 0) {
                return -1;
            }
        }
        unsigned char none = 0; /* no tagged field */
        return put(w, &none, 1);
    }
    return 0;
}

PyObject *
encode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) || !PyBytes_Check(args[2]) ||
        PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_message(programs: tuple, bodies: tuple, prefix: bytes)");
        return NULL;
    }
    writer w = {NULL, 0, 0};
    PyObject *prefix = args[2];
    PyObject *out = NULL;
    if (reserve(&w, 256) < 0 || put(&w, "\0\0\0\0", 4) < 0 ||
        put(&w, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix)) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++) {
        PyObject *body = PyTuple_GET_ITEM(args[1], i);
        if (!PyDict_CheckExact(body) || encode_struct(&w, PyTuple_GET_ITEM(args[0], i), body) < 0) {
            PyErr_Clear(); /* the Python encoder answers: it writes this body after all, or names what is wrong */
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (w.len - 4 > INT32_MAX) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    uint32_t size = (uint32_t)(w.len - 4);
    for (int i = 0; i < 4; i++) {
        w.buf[i] = (char)(size >> (8 * (3 - i)));
    }
    out = PyBytes_FromStringAndSize(w.buf, w.len);
done:
    PyMem_Free(w.buf);
    return out;
}
