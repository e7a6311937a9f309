/*
 * asyncconsumer._speedups: the compiled record decoder.
 *
 * One function does the per-record work of the consumer's hot path:
 *
 *     decode_batch(batch, topic, partition) -> list[ConsumerRecord]
 *
 * with exactly the contract of the pure-Python ``decode_batch_py`` in
 * asyncconsumer/protocol/records.py (which stays the reference and the
 * automatic fallback).  It parses the records section of a v2 record batch
 * (magic 2): zigzag varints, keys, values, headers, timestamp and offset
 * deltas; it builds each ConsumerRecord directly as an instance of the
 * NamedTuple (a tuple subclass without extra fields), so no Python code runs
 * per record.
 *
 * What stays in Python, called back from here:
 *   - decompression (``_decompress``; the codecs are Python libraries),
 *   - legacy message sets (magic 0/1): the whole batch goes to the Python
 *     decoder, as do batches whose varints or offsets do not fit in 64 bits
 *     (which only corrupt or hostile data has; Python's unbounded ints then
 *     give the reference answer).
 *
 * Corrupt record bytes raise CorruptRecordError(message, topic=, partition=,
 * offset=base_offset) with the Python decoder's wording.  Every read is
 * bounds-checked against the end of the batch.
 *
 * ``bind(record_type, corrupt_error, fallback, decompress)`` must be called
 * once (records.py does) before ``decode_batch`` is used.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define V2_HEADER_SIZE 61
#define CODEC_NONE 0
#define RECORD_FIELDS 11
#define ERRBUF 200
#define KEY_CACHE 8

/* Bound by bind(). */
static PyTypeObject *record_type = NULL; /* ConsumerRecord */
static PyObject *corrupt_error = NULL;   /* CorruptRecordError */
static PyObject *fallback = NULL;        /* decode_batch_py(batch, topic, partition) */
static PyObject *decompress_fn = NULL;   /* _decompress(batch, codec, topic, partition) -> bytes */

static PyObject *empty_tuple = NULL;
static PyObject *str_prefix = NULL; /* "record batch is corrupt: " */

/* Interned attribute names of RecordBatch. */
static PyObject *s_magic, *s_is_control, *s_compression, *s_buf, *s_start, *s_size_in_bytes, *s_record_count,
    *s_base_offset, *s_base_timestamp, *s_timestamp_type, *s_max_timestamp, *s_leader_epoch, *s_topic,
    *s_partition, *s_offset;

/* ------------------------------------------------------------------ parsing */

enum status {
    OK = 0,
    ERR_PYTHON = 1,   /* a Python exception is set (MemoryError, ...) */
    ERR_CORRUPT = 2,  /* the message is in the error buffer */
    ERR_FALLBACK = 3, /* not representable in 64 bits: let the Python decoder answer */
};

enum varint_result {
    VARINT_OK = 0,
    VARINT_PAST_END = -1,
    VARINT_TOO_LONG = -2,
    VARINT_TOO_BIG = -3,
};

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end;
    char err[ERRBUF];
    /* header keys decoded in this batch */
    int nkeys;
    Py_ssize_t key_len[KEY_CACHE];
    const unsigned char *key_at[KEY_CACHE];
    PyObject *key_str[KEY_CACHE];
} parser;

/* Unsigned (still zigzagged) varint of up to 10 bytes, as Kafka writes varlongs. */
static inline int
read_uvarint(parser *p, uint64_t *out)
{
    const unsigned char *buf = p->buf;
    Py_ssize_t pos = p->pos;
    Py_ssize_t end = p->end;
    if (pos >= end) {
        return VARINT_PAST_END;
    }
    unsigned int b = buf[pos++];
    if (b < 0x80) {
        *out = b;
        p->pos = pos;
        return VARINT_OK;
    }
    uint64_t result = b & 0x7F;
    int shift = 7;
    for (;;) {
        if (pos >= end) {
            return VARINT_PAST_END;
        }
        b = buf[pos++];
        if (shift == 63) { /* the tenth byte */
            if (b >= 0x80) {
                p->pos = pos;
                return VARINT_TOO_LONG;
            }
            if (b > 1) {
                return VARINT_TOO_BIG;
            }
        }
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = result;
            p->pos = pos;
            return VARINT_OK;
        }
        shift += 7;
    }
}

/* a + b, or 1 when it does not fit in 64 bits (Python's ints would just grow). */
static inline int
add_overflows(int64_t a, int64_t b, int64_t *out)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
        return 1;
    }
    *out = a + b;
    return 0;
}

static inline int64_t
unzigzag(uint64_t u)
{
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static int
varint_status(parser *p, int r)
{
    if (r == VARINT_PAST_END) {
        PyOS_snprintf(p->err, ERRBUF, "record runs past the end of the batch");
        return ERR_CORRUPT;
    }
    if (r == VARINT_TOO_LONG) {
        PyOS_snprintf(p->err, ERRBUF, "varint longer than 10 bytes at byte %zd", p->pos);
        return ERR_CORRUPT;
    }
    return ERR_FALLBACK;
}

/* Read a signed varint into ``var`` or return the failure status. */
#define READ_VARINT(var)                                      \
    do {                                                      \
        uint64_t u_;                                          \
        int r_ = read_uvarint(p, &u_);                        \
        if (r_ != VARINT_OK) {                                \
            status = varint_status(p, r_);                    \
            goto fail;                                        \
        }                                                     \
        (var) = unzigzag(u_);                                 \
    } while (0)

#define CORRUPT(...)                                          \
    do {                                                      \
        PyOS_snprintf(p->err, ERRBUF, __VA_ARGS__);           \
        status = ERR_CORRUPT;                                 \
        goto fail;                                            \
    } while (0)

static PyObject *
header_key(parser *p, Py_ssize_t len)
{
    const unsigned char *at = p->buf + p->pos;
    for (int i = 0; i < p->nkeys; i++) {
        if (p->key_len[i] == len && memcmp(p->key_at[i], at, (size_t)len) == 0) {
            Py_INCREF(p->key_str[i]);
            return p->key_str[i];
        }
    }
    /* Java decodes header keys leniently: malformed UTF-8 becomes U+FFFD. */
    PyObject *key = PyUnicode_DecodeUTF8((const char *)at, len, "replace");
    if (key != NULL && p->nkeys < KEY_CACHE) {
        p->key_len[p->nkeys] = len;
        p->key_at[p->nkeys] = at;
        Py_INCREF(key);
        p->key_str[p->nkeys++] = key;
    }
    return key;
}

/* The headers of one record: a tuple of (str, bytes | None) pairs. */
static PyObject *
read_headers(parser *p, int64_t count, int *statusp)
{
    int status = ERR_PYTHON;
    PyObject *headers = NULL;
    if (count < 0) {
        PyOS_snprintf(p->err, ERRBUF, "negative header count %lld", (long long)count);
        *statusp = ERR_CORRUPT;
        return NULL;
    }
    /* Every header takes at least two bytes, so a larger count cannot parse:
     * allocate for what fits, and the read that runs out reports the error. */
    Py_ssize_t room = (p->end - p->pos) / 2;
    Py_ssize_t n = count < (int64_t)room ? (Py_ssize_t)count : room;
    headers = PyTuple_New(n);
    if (headers == NULL) {
        goto fail;
    }
    for (int64_t i = 0; i < count; i++) {
        int64_t klen, vlen;
        READ_VARINT(klen);
        if (klen < 0) {
            CORRUPT("invalid header key length %lld", (long long)klen);
        }
        if (klen > p->end - p->pos) {
            CORRUPT("record runs past the end of the batch");
        }
        PyObject *key = header_key(p, (Py_ssize_t)klen);
        if (key == NULL) {
            status = ERR_PYTHON;
            goto fail;
        }
        p->pos += (Py_ssize_t)klen;
        uint64_t u;
        int r = read_uvarint(p, &u);
        if (r != VARINT_OK) {
            Py_DECREF(key);
            status = varint_status(p, r);
            goto fail;
        }
        vlen = unzigzag(u);
        PyObject *value;
        if (vlen >= 0) {
            if (vlen > p->end - p->pos) {
                Py_DECREF(key);
                CORRUPT("record runs past the end of the batch");
            }
            value = PyBytes_FromStringAndSize((const char *)p->buf + p->pos, (Py_ssize_t)vlen);
            if (value == NULL) {
                Py_DECREF(key);
                status = ERR_PYTHON;
                goto fail;
            }
            p->pos += (Py_ssize_t)vlen;
        }
        else if (vlen == -1) {
            value = Py_None;
            Py_INCREF(value);
        }
        else {
            Py_DECREF(key);
            CORRUPT("invalid header value length %lld", (long long)vlen);
        }
        if (i >= n) { /* unreachable: see ``room`` */
            Py_DECREF(key);
            Py_DECREF(value);
            CORRUPT("record runs past the end of the batch");
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            status = ERR_PYTHON;
            goto fail;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyObject_GC_UnTrack(pair); /* holds a str and bytes/None: can never be in a cycle */
        PyTuple_SET_ITEM(headers, (Py_ssize_t)i, pair);
    }
    PyObject_GC_UnTrack(headers);
    return headers;
fail:
    Py_XDECREF(headers);
    *statusp = status;
    return NULL;
}

/* A Python int, reusing the previous one when the value repeats. */
static inline PyObject *
cached_long(int64_t value, int64_t *last, PyObject **last_obj)
{
    if (*last_obj != NULL && *last == value) {
        Py_INCREF(*last_obj);
        return *last_obj;
    }
    PyObject *obj = PyLong_FromLongLong(value);
    if (obj != NULL) {
        Py_XDECREF(*last_obj);
        Py_INCREF(obj);
        *last_obj = obj;
        *last = value;
    }
    return obj;
}

typedef struct {
    int64_t count;
    int64_t base_offset;
    int64_t base_timestamp;
    int log_append_time;
    PyObject *log_append_ts;   /* max_timestamp, used when log_append_time */
    PyObject *timestamp_type;  /* the batch's 0 / 1 */
    PyObject *leader_epoch;    /* int or None */
    PyObject *topic;
    PyObject *partition;
} batch_info;

static PyObject *
parse_records(parser *p, const batch_info *bi, int *statusp)
{
    int status = ERR_PYTHON;
    PyObject *out = NULL;
    int64_t last_ts = 0, last_klen = 0, last_vlen = 0;
    PyObject *last_ts_obj = NULL, *last_klen_obj = NULL, *last_vlen_obj = NULL;

    /* A record takes at least 7 bytes (six varints and the attributes byte),
     * so no more than this many can parse; a larger count fails on the way. */
    Py_ssize_t room = (p->end - p->pos) / 7;
    Py_ssize_t n = bi->count < 0 ? 0 : (bi->count < (int64_t)room ? (Py_ssize_t)bi->count : room);
    out = PyList_New(n);
    if (out == NULL) {
        goto fail;
    }
    for (int64_t i = 0; i < bi->count; i++) {
        int64_t length, ts_delta, offset_delta, klen, vlen, nheaders;
        READ_VARINT(length);
        Py_ssize_t body_start = p->pos;
        if (p->pos >= p->end) {
            CORRUPT("record runs past the end of the batch");
        }
        p->pos += 1; /* attributes: unused */
        READ_VARINT(ts_delta);
        READ_VARINT(offset_delta);
        int64_t offset, ts = 0;
        if (add_overflows(bi->base_offset, offset_delta, &offset)) {
            status = ERR_FALLBACK;
            goto fail;
        }
        if (!bi->log_append_time && add_overflows(bi->base_timestamp, ts_delta, &ts)) {
            status = ERR_FALLBACK;
            goto fail;
        }
        READ_VARINT(klen);
        const unsigned char *key_at = NULL;
        if (klen >= 0) {
            if (klen > p->end - p->pos) {
                CORRUPT("record runs past the end of the batch");
            }
            key_at = p->buf + p->pos;
            p->pos += (Py_ssize_t)klen;
        }
        else if (klen != -1) {
            CORRUPT("invalid key length %lld at offset %lld", (long long)klen, (long long)offset);
        }
        READ_VARINT(vlen);
        const unsigned char *value_at = NULL;
        if (vlen >= 0) {
            if (vlen > p->end - p->pos) {
                CORRUPT("record runs past the end of the batch");
            }
            value_at = p->buf + p->pos;
            p->pos += (Py_ssize_t)vlen;
        }
        else if (vlen != -1) {
            CORRUPT("invalid value length %lld at offset %lld", (long long)vlen, (long long)offset);
        }
        PyObject *headers;
        if (p->pos < p->end && p->buf[p->pos] == 0) {
            p->pos += 1;
            headers = empty_tuple;
            Py_INCREF(headers);
        }
        else {
            READ_VARINT(nheaders);
            headers = read_headers(p, nheaders, &status);
            if (headers == NULL) {
                goto fail;
            }
        }
        if ((int64_t)(p->pos - body_start) != length) {
            Py_DECREF(headers);
            CORRUPT("record at offset %lld does not match its length field", (long long)offset);
        }
        if (i >= n) { /* unreachable: see ``room`` */
            Py_DECREF(headers);
            CORRUPT("record runs past the end of the batch");
        }

        PyObject *key, *value, *offset_obj, *ts_obj, *klen_obj, *vlen_obj;
        if (key_at != NULL) {
            key = PyBytes_FromStringAndSize((const char *)key_at, (Py_ssize_t)klen);
        }
        else {
            key = Py_None;
            Py_INCREF(key);
        }
        if (value_at != NULL) {
            value = PyBytes_FromStringAndSize((const char *)value_at, (Py_ssize_t)vlen);
        }
        else {
            value = Py_None;
            Py_INCREF(value);
        }
        offset_obj = PyLong_FromLongLong(offset);
        if (bi->log_append_time) {
            ts_obj = bi->log_append_ts;
            Py_INCREF(ts_obj);
        }
        else {
            ts_obj = cached_long(ts, &last_ts, &last_ts_obj);
        }
        klen_obj = cached_long(klen, &last_klen, &last_klen_obj);
        vlen_obj = cached_long(vlen, &last_vlen, &last_vlen_obj);
        PyObject *record = NULL;
        if (key != NULL && value != NULL && offset_obj != NULL && ts_obj != NULL && klen_obj != NULL &&
            vlen_obj != NULL) {
            /* What tuple.__new__(ConsumerRecord, ...) does, without the
             * intermediate tuple: the NamedTuple adds no fields to tuple. */
            record = record_type->tp_alloc(record_type, RECORD_FIELDS);
        }
        if (record == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(offset_obj);
            Py_XDECREF(ts_obj);
            Py_XDECREF(klen_obj);
            Py_XDECREF(vlen_obj);
            Py_DECREF(headers);
            status = ERR_PYTHON;
            goto fail;
        }
        Py_INCREF(bi->topic);
        PyTuple_SET_ITEM(record, 0, bi->topic);
        Py_INCREF(bi->partition);
        PyTuple_SET_ITEM(record, 1, bi->partition);
        PyTuple_SET_ITEM(record, 2, offset_obj);
        PyTuple_SET_ITEM(record, 3, ts_obj);
        Py_INCREF(bi->timestamp_type);
        PyTuple_SET_ITEM(record, 4, bi->timestamp_type);
        PyTuple_SET_ITEM(record, 5, key);
        PyTuple_SET_ITEM(record, 6, value);
        PyTuple_SET_ITEM(record, 7, klen_obj);
        PyTuple_SET_ITEM(record, 8, vlen_obj);
        PyTuple_SET_ITEM(record, 9, headers);
        Py_INCREF(bi->leader_epoch);
        PyTuple_SET_ITEM(record, 10, bi->leader_epoch);
        /* Only atomic values (str, int, bytes, None, untracked header tuples):
         * the record can never be part of a reference cycle, so the cyclic GC
         * need not scan it (it would untrack it itself on its first pass). */
        PyObject_GC_UnTrack(record);
        PyList_SET_ITEM(out, (Py_ssize_t)i, record);
    }
    if (p->pos != p->end) {
        Py_ssize_t diff = p->end - p->pos;
        CORRUPT("declared record count %lld does not match the batch bytes (%zd bytes %s)", (long long)bi->count,
                diff < 0 ? -diff : diff, diff > 0 ? "left over" : "missing");
    }
    Py_XDECREF(last_ts_obj);
    Py_XDECREF(last_klen_obj);
    Py_XDECREF(last_vlen_obj);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(last_ts_obj);
    Py_XDECREF(last_klen_obj);
    Py_XDECREF(last_vlen_obj);
    *statusp = status;
    return NULL;
}

/* ------------------------------------------------------------------ decode_batch */

static int
get_int64(PyObject *obj, PyObject *name, int64_t *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static PyObject *
call_fallback(PyObject *batch, PyObject *topic, PyObject *partition)
{
    return PyObject_CallFunctionObjArgs(fallback, batch, topic, partition, NULL);
}

static void
raise_corrupt(const char *detail, PyObject *topic, PyObject *partition, int64_t base_offset)
{
    PyObject *msg = PyUnicode_FromFormat("%U%s", str_prefix, detail);
    PyObject *args = NULL, *kwargs = NULL, *offset = NULL, *exc = NULL;
    if (msg == NULL) {
        return;
    }
    args = PyTuple_Pack(1, msg);
    kwargs = PyDict_New();
    offset = PyLong_FromLongLong(base_offset);
    if (args == NULL || kwargs == NULL || offset == NULL || PyDict_SetItem(kwargs, s_topic, topic) < 0 ||
        PyDict_SetItem(kwargs, s_partition, partition) < 0 || PyDict_SetItem(kwargs, s_offset, offset) < 0) {
        goto done;
    }
    exc = PyObject_Call(corrupt_error, args, kwargs);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    }
done:
    Py_XDECREF(msg);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(offset);
    Py_XDECREF(exc);
}

static PyObject *
decode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode_batch(batch, topic, partition) takes exactly 3 arguments");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncconsumer._speedups.bind() was not called");
        return NULL;
    }
    PyObject *batch = args[0], *topic = args[1], *partition = args[2];
    PyObject *result = NULL, *data = NULL, *ts_type = NULL, *log_ts = NULL, *epoch = NULL;
    int64_t magic, is_control, codec, start = 0, size = 0;
    Py_buffer view;
    int have_view = 0;

    if (get_int64(batch, s_magic, &magic) < 0) {
        return NULL;
    }
    if (magic != 2) {
        return call_fallback(batch, topic, partition);
    }
    PyObject *control = PyObject_GetAttr(batch, s_is_control);
    if (control == NULL) {
        return NULL;
    }
    is_control = PyObject_IsTrue(control);
    Py_DECREF(control);
    if (is_control < 0) {
        return NULL;
    }
    if (is_control) {
        return PyList_New(0);
    }

    batch_info bi;
    parser p;
    p.nkeys = 0;
    if (get_int64(batch, s_compression, &codec) < 0 || get_int64(batch, s_record_count, &bi.count) < 0 ||
        get_int64(batch, s_base_offset, &bi.base_offset) < 0 ||
        get_int64(batch, s_base_timestamp, &bi.base_timestamp) < 0) {
        return NULL;
    }
    if (codec == CODEC_NONE) {
        data = PyObject_GetAttr(batch, s_buf);
        if (data == NULL || get_int64(batch, s_start, &start) < 0 || get_int64(batch, s_size_in_bytes, &size) < 0) {
            goto done;
        }
    }
    else {
        PyObject *codec_obj = PyLong_FromLongLong(codec);
        if (codec_obj == NULL) {
            goto done;
        }
        data = PyObject_CallFunctionObjArgs(decompress_fn, batch, codec_obj, topic, partition, NULL);
        Py_DECREF(codec_obj);
        if (data == NULL) {
            goto done;
        }
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        /* Not a contiguous byte buffer: the Python decoder copes with anything indexable. */
        PyErr_Clear();
        result = call_fallback(batch, topic, partition);
        goto done;
    }
    have_view = 1;
    p.buf = (const unsigned char *)view.buf;
    if (codec == CODEC_NONE) {
        p.pos = (Py_ssize_t)start + V2_HEADER_SIZE;
        p.end = (Py_ssize_t)(start + size);
        if (start < 0 || size < V2_HEADER_SIZE || p.end > view.len) {
            PyErr_SetString(PyExc_ValueError, "record batch bounds lie outside its buffer");
            goto done;
        }
    }
    else {
        p.pos = 0;
        p.end = view.len;
    }

    ts_type = PyObject_GetAttr(batch, s_timestamp_type);
    epoch = PyObject_GetAttr(batch, s_leader_epoch);
    if (ts_type == NULL || epoch == NULL) {
        goto done;
    }
    bi.log_append_time = PyObject_IsTrue(ts_type);
    if (bi.log_append_time < 0) {
        goto done;
    }
    if (bi.log_append_time) {
        log_ts = PyObject_GetAttr(batch, s_max_timestamp);
        if (log_ts == NULL) {
            goto done;
        }
    }
    bi.log_append_ts = log_ts;
    bi.timestamp_type = ts_type;
    bi.leader_epoch = epoch;
    bi.topic = topic;
    bi.partition = partition;

    int status = OK;
    result = parse_records(&p, &bi, &status);
    if (result == NULL) {
        if (status == ERR_CORRUPT) {
            raise_corrupt(p.err, topic, partition, bi.base_offset);
        }
        else if (status == ERR_FALLBACK) {
            result = call_fallback(batch, topic, partition);
        }
    }
done:
    for (int i = 0; i < p.nkeys; i++) {
        Py_DECREF(p.key_str[i]);
    }
    if (have_view) {
        PyBuffer_Release(&view);
    }
    Py_XDECREF(data);
    Py_XDECREF(ts_type);
    Py_XDECREF(log_ts);
    Py_XDECREF(epoch);
    return result;
}

/* ------------------------------------------------------------------ bind */

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *rtype, *error, *fb, *dec;
    if (!PyArg_ParseTuple(args, "O!OOO:bind", &PyType_Type, &rtype, &error, &fb, &dec)) {
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)rtype;
    /* Records are allocated as plain tuples of the subtype: only valid when
     * the subclass adds nothing to tuple's layout (NamedTuple sets
     * __slots__ = ()). */
    if (!PyType_IsSubtype(t, &PyTuple_Type) || t->tp_basicsize != PyTuple_Type.tp_basicsize ||
        t->tp_itemsize != PyTuple_Type.tp_itemsize || t->tp_dictoffset != 0 || t->tp_weaklistoffset != 0 ||
        t->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass without extra fields");
        return NULL;
    }
    if (!PyCallable_Check(error) || !PyCallable_Check(fb) || !PyCallable_Check(dec)) {
        PyErr_SetString(PyExc_TypeError, "corrupt_error, fallback and decompress must be callable");
        return NULL;
    }
    Py_INCREF(rtype);
    Py_XSETREF(record_type, t);
    Py_INCREF(error);
    Py_XSETREF(corrupt_error, error);
    Py_INCREF(fb);
    Py_XSETREF(fallback, fb);
    Py_INCREF(dec);
    Py_XSETREF(decompress_fn, dec);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ module */

PyDoc_STRVAR(decode_batch_doc,
             "decode_batch(batch, topic, partition) -> list[ConsumerRecord]\n\n"
             "Decode every record of a RecordBatch; the compiled twin of records.decode_batch_py.");
PyDoc_STRVAR(bind_doc,
             "bind(record_type, corrupt_error, fallback, decompress) -> None\n\n"
             "Give the decoder the record type, the error class, the Python decoder (for legacy\n"
             "message sets and values beyond 64 bits) and the decompression function.");

static PyMethodDef methods[] = {
    {"decode_batch", (PyCFunction)(void (*)(void))decode_batch, METH_FASTCALL, decode_batch_doc},
    {"bind", (PyCFunction)bind, METH_VARARGS, bind_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "asyncconsumer._speedups",
    "Compiled record decoder for asyncconsumer (optional; records.py falls back to Python).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int
intern(PyObject **slot, const char *name)
{
    *slot = PyUnicode_InternFromString(name);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (intern(&s_magic, "magic") < 0 || intern(&s_is_control, "is_control") < 0 ||
        intern(&s_compression, "compression") < 0 || intern(&s_buf, "_buf") < 0 || intern(&s_start, "_start") < 0 ||
        intern(&s_size_in_bytes, "size_in_bytes") < 0 || intern(&s_record_count, "record_count") < 0 ||
        intern(&s_base_offset, "base_offset") < 0 || intern(&s_base_timestamp, "base_timestamp") < 0 ||
        intern(&s_timestamp_type, "timestamp_type") < 0 || intern(&s_max_timestamp, "max_timestamp") < 0 ||
        intern(&s_leader_epoch, "leader_epoch") < 0 || intern(&s_topic, "topic") < 0 ||
        intern(&s_partition, "partition") < 0 || intern(&s_offset, "offset") < 0) {
        return NULL;
    }
    empty_tuple = PyTuple_New(0);
    str_prefix = PyUnicode_FromString("record batch is corrupt: ");
    if (empty_tuple == NULL || str_prefix == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_def);
}
