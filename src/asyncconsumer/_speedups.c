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
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_add_overflow(a, b, out);
#else
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
        return 1;
    }
    *out = a + b;
    return 0;
#endif
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

#if defined(__GNUC__) || defined(__clang__)
#define HOT static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define HOT static __forceinline
#else
#define HOT static inline
#endif

/* The fields of a record before its headers, shared by the row and column decoders. */
typedef struct {
    int64_t length;
    Py_ssize_t body_start;
    int64_t offset;
    int64_t ts;                /* base_timestamp + delta; untouched with LogAppendTime */
    const unsigned char *key;  /* NULL: a null key */
    const unsigned char *value;
    int64_t klen, vlen;        /* -1 for null */
} record_head;

/* A record up to its headers, every read checked against the batch. */
HOT int
read_record_head(parser *p, int64_t base_offset, int64_t base_timestamp, int log_append_time, record_head *r)
{
    int status = ERR_PYTHON;
    int64_t ts_delta, offset_delta;
    READ_VARINT(r->length);
    r->body_start = p->pos;
    if (p->pos >= p->end) {
        CORRUPT("record runs past the end of the batch");
    }
    p->pos += 1; /* attributes: unused */
    READ_VARINT(ts_delta);
    READ_VARINT(offset_delta);
    if (add_overflows(base_offset, offset_delta, &r->offset)) {
        return ERR_FALLBACK;
    }
    if (!log_append_time && add_overflows(base_timestamp, ts_delta, &r->ts)) {
        return ERR_FALLBACK;
    }
    READ_VARINT(r->klen);
    r->key = NULL;
    if (r->klen >= 0) {
        if (r->klen > p->end - p->pos) {
            CORRUPT("record runs past the end of the batch");
        }
        r->key = p->buf + p->pos;
        p->pos += (Py_ssize_t)r->klen;
    }
    else if (r->klen != -1) {
        CORRUPT("invalid key length %lld at offset %lld", (long long)r->klen, (long long)r->offset);
    }
    READ_VARINT(r->vlen);
    r->value = NULL;
    if (r->vlen >= 0) {
        if (r->vlen > p->end - p->pos) {
            CORRUPT("record runs past the end of the batch");
        }
        r->value = p->buf + p->pos;
        p->pos += (Py_ssize_t)r->vlen;
    }
    else if (r->vlen != -1) {
        CORRUPT("invalid value length %lld at offset %lld", (long long)r->vlen, (long long)r->offset);
    }
    return OK;
fail:
    return status;
}

/* The record's header count: nearly always the single byte 0. */
HOT int
read_header_count(parser *p, int64_t *count)
{
    int status = ERR_PYTHON;
    if (p->pos < p->end && p->buf[p->pos] == 0) {
        p->pos += 1;
        *count = 0;
        return OK;
    }
    READ_VARINT(*count);
    if (*count < 0) {
        CORRUPT("negative header count %lld", (long long)*count);
    }
    return OK;
fail:
    return status;
}

/* One header: its key and value (NULL: null) where they lie in the batch. */
HOT int
read_header(parser *p, const unsigned char **key, Py_ssize_t *klen, const unsigned char **value, Py_ssize_t *vlen)
{
    int status = ERR_PYTHON;
    int64_t k, v;
    READ_VARINT(k);
    if (k < 0) {
        CORRUPT("invalid header key length %lld", (long long)k);
    }
    if (k > p->end - p->pos) {
        CORRUPT("record runs past the end of the batch");
    }
    *key = p->buf + p->pos;
    *klen = (Py_ssize_t)k;
    p->pos += (Py_ssize_t)k;
    READ_VARINT(v);
    *value = NULL;
    *vlen = 0;
    if (v >= 0) {
        if (v > p->end - p->pos) {
            CORRUPT("record runs past the end of the batch");
        }
        *value = p->buf + p->pos;
        *vlen = (Py_ssize_t)v;
        p->pos += (Py_ssize_t)v;
    }
    else if (v != -1) {
        CORRUPT("invalid header value length %lld", (long long)v);
    }
    return OK;
fail:
    return status;
}

/* Every record ends where its length field says. */
HOT int
check_record_end(parser *p, const record_head *r)
{
    if ((int64_t)(p->pos - r->body_start) != r->length) {
        PyOS_snprintf(p->err, ERRBUF, "record at offset %lld does not match its length field", (long long)r->offset);
        return ERR_CORRUPT;
    }
    return OK;
}

/* The last record ends where the batch does. */
static int
check_batch_end(parser *p, int64_t count)
{
    if (p->pos != p->end) {
        Py_ssize_t diff = p->end - p->pos;
        PyOS_snprintf(p->err, ERRBUF, "declared record count %lld does not match the batch bytes (%zd bytes %s)",
                      (long long)count, diff < 0 ? -diff : diff, diff > 0 ? "left over" : "missing");
        return ERR_CORRUPT;
    }
    return OK;
}

static PyObject *
header_key(parser *p, const unsigned char *at, Py_ssize_t len)
{
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

/* The headers of one record (count > 0): a tuple of (str, bytes | None) pairs. */
static PyObject *
read_headers(parser *p, int64_t count, int *statusp)
{
    /* Every header takes at least two bytes, so a larger count cannot parse:
     * allocate for what fits, and the read that runs out reports the error. */
    Py_ssize_t room = (p->end - p->pos) / 2;
    Py_ssize_t n = count < (int64_t)room ? (Py_ssize_t)count : room;
    PyObject *headers = PyTuple_New(n);
    int status = ERR_PYTHON;
    if (headers == NULL) {
        goto fail;
    }
    for (int64_t i = 0; i < count; i++) {
        const unsigned char *kat, *vat;
        Py_ssize_t klen, vlen;
        status = read_header(p, &kat, &klen, &vat, &vlen);
        if (status != OK) {
            goto fail;
        }
        status = ERR_PYTHON;
        if (i >= n) { /* unreachable: see ``room`` */
            PyOS_snprintf(p->err, ERRBUF, "record runs past the end of the batch");
            status = ERR_CORRUPT;
            goto fail;
        }
        PyObject *key = header_key(p, kat, klen);
        if (key == NULL) {
            goto fail;
        }
        PyObject *value = Py_None;
        if (vat != NULL) {
            value = PyBytes_FromStringAndSize((const char *)vat, vlen);
            if (value == NULL) {
                Py_DECREF(key);
                goto fail;
            }
        }
        else {
            Py_INCREF(value);
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
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
        record_head r;
        int64_t nheaders;
        r.ts = 0; /* set unless LogAppendTime */
        if ((status = read_record_head(p, bi->base_offset, bi->base_timestamp, bi->log_append_time, &r)) != OK ||
            (status = read_header_count(p, &nheaders)) != OK) {
            goto fail;
        }
        PyObject *headers = empty_tuple;
        if (nheaders == 0) {
            Py_INCREF(headers);
        }
        else if ((headers = read_headers(p, nheaders, &status)) == NULL) {
            goto fail;
        }
        if ((status = check_record_end(p, &r)) != OK) {
            Py_DECREF(headers);
            goto fail;
        }
        if (i >= n) { /* unreachable: see ``room`` */
            Py_DECREF(headers);
            PyOS_snprintf(p->err, ERRBUF, "record runs past the end of the batch");
            status = ERR_CORRUPT;
            goto fail;
        }
        status = ERR_PYTHON;

        PyObject *key, *value, *offset_obj, *ts_obj, *klen_obj, *vlen_obj;
        if (r.key != NULL) {
            key = PyBytes_FromStringAndSize((const char *)r.key, (Py_ssize_t)r.klen);
        }
        else {
            key = Py_None;
            Py_INCREF(key);
        }
        if (r.value != NULL) {
            value = PyBytes_FromStringAndSize((const char *)r.value, (Py_ssize_t)r.vlen);
        }
        else {
            value = Py_None;
            Py_INCREF(value);
        }
        offset_obj = PyLong_FromLongLong(r.offset);
        if (bi->log_append_time) {
            ts_obj = bi->log_append_ts;
            Py_INCREF(ts_obj);
        }
        else {
            ts_obj = cached_long(r.ts, &last_ts, &last_ts_obj);
        }
        klen_obj = cached_long(r.klen, &last_klen, &last_klen_obj);
        vlen_obj = cached_long(r.vlen, &last_vlen, &last_vlen_obj);
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
    if ((status = check_batch_end(p, bi->count)) != OK) {
        goto fail;
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

/* Raise CorruptRecordError("record batch is corrupt: " + detail, topic=, partition=, offset=). */
static void
raise_corrupt_obj(PyObject *detail, PyObject *topic, PyObject *partition, int64_t base_offset)
{
    PyObject *msg = PyUnicode_Concat(str_prefix, detail);
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

static void
raise_corrupt(const char *detail, PyObject *topic, PyObject *partition, int64_t base_offset)
{
    PyObject *text = PyUnicode_FromString(detail);
    if (text != NULL) {
        raise_corrupt_obj(text, topic, partition, base_offset);
        Py_DECREF(text);
    }
}

/* Where a v2 batch's records section lies: in the batch's own buffer, or in
 * the bytes ``_decompress`` returned.  The caller releases it with
 * close_records() whatever open_records() returned. */
typedef struct {
    PyObject *data;
    Py_buffer view;
    int have_view;
} records_src;

enum open_result {
    OPEN_OK = 0,
    OPEN_ERROR = -1,      /* a Python exception is set */
    OPEN_NOT_BUFFER = 1,  /* not a contiguous byte buffer: the Python decoder copes with anything indexable */
};

static int
open_records(PyObject *batch, int64_t codec, PyObject *topic, PyObject *partition, parser *p, records_src *src)
{
    int64_t start = 0, size = 0;
    src->data = NULL;
    src->have_view = 0;
    if (codec == CODEC_NONE) {
        src->data = PyObject_GetAttr(batch, s_buf);
        if (src->data == NULL || get_int64(batch, s_start, &start) < 0 || get_int64(batch, s_size_in_bytes, &size) < 0) {
            return OPEN_ERROR;
        }
    }
    else {
        PyObject *codec_obj = PyLong_FromLongLong(codec);
        if (codec_obj == NULL) {
            return OPEN_ERROR;
        }
        src->data = PyObject_CallFunctionObjArgs(decompress_fn, batch, codec_obj, topic, partition, NULL);
        Py_DECREF(codec_obj);
        if (src->data == NULL) {
            return OPEN_ERROR;
        }
    }
    if (PyObject_GetBuffer(src->data, &src->view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return OPEN_NOT_BUFFER;
    }
    src->have_view = 1;
    p->buf = (const unsigned char *)src->view.buf;
    if (codec == CODEC_NONE) {
        p->pos = (Py_ssize_t)start + V2_HEADER_SIZE;
        p->end = (Py_ssize_t)(start + size);
        if (start < 0 || size < V2_HEADER_SIZE || p->end > src->view.len) {
            PyErr_SetString(PyExc_ValueError, "record batch bounds lie outside its buffer");
            return OPEN_ERROR;
        }
    }
    else {
        p->pos = 0;
        p->end = src->view.len;
    }
    return OPEN_OK;
}

static void
close_records(records_src *src)
{
    if (src->have_view) {
        PyBuffer_Release(&src->view);
        src->have_view = 0;
    }
    Py_CLEAR(src->data);
}

/* The batch's ``is_control`` as 0/1, or -1 with an exception set. */
static int
batch_is_control(PyObject *batch)
{
    PyObject *control = PyObject_GetAttr(batch, s_is_control);
    if (control == NULL) {
        return -1;
    }
    int is_control = PyObject_IsTrue(control);
    Py_DECREF(control);
    return is_control;
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
    PyObject *result = NULL, *ts_type = NULL, *log_ts = NULL, *epoch = NULL;
    int64_t magic, codec;
    records_src src = {NULL};

    if (get_int64(batch, s_magic, &magic) < 0) {
        return NULL;
    }
    if (magic != 2) {
        return call_fallback(batch, topic, partition);
    }
    int is_control = batch_is_control(batch);
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
    int opened = open_records(batch, codec, topic, partition, &p, &src);
    if (opened == OPEN_NOT_BUFFER) {
        result = call_fallback(batch, topic, partition);
        goto done;
    }
    if (opened == OPEN_ERROR) {
        goto done;
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
    close_records(&src);
    Py_XDECREF(ts_type);
    Py_XDECREF(log_ts);
    Py_XDECREF(epoch);
    return result;
}

/* ------------------------------------------------------------------ CRC-32C
 *
 * The v2 batch checksum (Castagnoli, reflected polynomial 0x82F63B78), for the column walk,
 * which checks every batch without a call into the ``crc32c`` package per batch.  On x86-64 with
 * SSE4.2 it runs six interleaved streams of the CRC32 instruction over blocks of CRC_BLOCK bytes
 * (its latency is three times its throughput, and newer cores, AMD's Zen 5 among them, run two at
 * once: six streams take 64 GB/s there, three 32), then three for what is left, and joins them:
 * the state after a block of data is linear in the state before it, so the state of stream one
 * after CRC_BLOCK more bytes is ``crc_skip_block(state)`` (four table lookups), XORed with stream
 * two's, which started at 0; and so on down the streams.
 * Where the core also has VPCLMULQDQ (with AVX-512: Intel since Ice Lake, AMD since Zen 4; with
 * AVX2 only: AMD's Zen 3, Intel's client cores since Alder Lake), inputs of CRC_FOLD_MIN bytes or
 * more are folded instead (crc_fold512, crc_fold256): the CRC is a remainder modulo the
 * polynomial P, and a 16-byte block followed by D more bits may be replaced by
 * lo * (x^(D+32) mod P) + hi * (x^(D-32) mod P) (its two halves times constants, carry-less
 * products of at most 96 bits) XORed into the block D bits later, with the same remainder; four
 * 64-byte registers fold 256 bytes a step (four 32-byte ones 128), 32 bytes a cycle against the
 * CRC32 instruction's 8.  The last 16 bytes folded go through the CRC32 instruction, which
 * finishes the remainder.
 * Elsewhere a byte-at-a-time table does the same work, and the Python side does not use the walk
 * to check CRCs (``HW_CRC32C`` is False).  ``crc32c_kernel(name, data)`` runs one of them by name
 * (``CRC32C_KERNELS``, the ones this machine has, best first), for the tests.
 */

#define CRC32C_POLY 0x82F63B78u
#define CRC_BLOCK 1024 /* bytes per stream in the three-stream loop: a multiple of 8 */

static uint32_t crc_table[256];
static uint32_t crc_block_table[4][256]; /* [k][v]: the state v << 8k after CRC_BLOCK zero bytes */

static uint32_t
crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n--) {
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return c;
}

static inline uint32_t
crc_skip_block(uint32_t c)
{
    return crc_block_table[0][c & 0xFF] ^ crc_block_table[1][(c >> 8) & 0xFF] ^ crc_block_table[2][(c >> 16) & 0xFF] ^
           crc_block_table[3][c >> 24];
}

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        }
        crc_table[i] = c;
    }
    /* A state's bits after CRC_BLOCK zero bytes, one bit at a time; a byte's table is their XORs. */
    uint32_t bit[32];
    for (int b = 0; b < 32; b++) {
        uint32_t c = (uint32_t)1 << b;
        for (int i = 0; i < CRC_BLOCK; i++) {
            c = crc_table[c & 0xFF] ^ (c >> 8);
        }
        bit[b] = c;
    }
    for (int k = 0; k < 4; k++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t c = 0;
            for (int b = 0; b < 8; b++) {
                if (v & (1u << b)) {
                    c ^= bit[8 * k + b];
                }
            }
            crc_block_table[k][v] = c;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1

/* The state after ``streams`` consecutive blocks of CRC_BLOCK bytes from ``p``, from state ``c``:
 * one stream per block, run side by side, joined in order.  Inlined with a constant ``streams``,
 * the streams stay in registers. */
__attribute__((target("sse4.2"), always_inline)) static inline uint32_t
crc_blocks(uint32_t c, const unsigned char *p, int streams)
{
    uint64_t s[6] = {c, 0, 0, 0, 0, 0};
    for (size_t at = 0; at < CRC_BLOCK; at += 8) {
        for (int i = 0; i < streams; i++) {
            uint64_t a;
            memcpy(&a, p + (size_t)i * CRC_BLOCK + at, 8);
            s[i] = _mm_crc32_u64(s[i], a);
        }
    }
    c = (uint32_t)s[0];
    for (int i = 1; i < streams; i++) {
        c = crc_skip_block(c) ^ (uint32_t)s[i];
    }
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t c, const unsigned char *p, size_t n)
{
    for (; n >= 6 * CRC_BLOCK; p += 6 * CRC_BLOCK, n -= 6 * CRC_BLOCK) {
        c = crc_blocks(c, p, 6);
    }
    if (n >= 3 * CRC_BLOCK) {
        c = crc_blocks(c, p, 3);
        p += 3 * CRC_BLOCK;
        n -= 3 * CRC_BLOCK;
    }
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c64 = _mm_crc32_u64(c64, a);
    }
    c = (uint32_t)c64;
    while (n--) {
        c = _mm_crc32_u8(c, *p++);
    }
    return c;
}
#endif

#if defined(HAVE_HW_CRC) && (defined(__clang__) || __GNUC__ >= 10)
#include <immintrin.h>
#define HAVE_FOLD_CRC 1
#define CRC_FOLD_MIN 256 /* bytes: below this crc_hw is as fast */

/* Per 128-bit lane, the constants that fold a block D bits forward: x^(D+32) mod P for its first
 * 8 bytes (the low qword), x^(D-32) mod P for the next 8, each bit-reflected in 32 bits and
 * shifted left by one (a carry-less product of reflected operands comes out one bit short).
 */
#define FOLD_K(d_plus, d_minus) _mm_set_epi64x((long long)(d_minus), (long long)(d_plus))
#define K_2048 FOLD_K(0xdcb17aa4u, 0xb9e02b86u)
#define K_1024 FOLD_K(0x6992cea2u, 0x0d3b6092u)
#define K_512 FOLD_K(0x740eef02u, 0x9e4addf8u)
#define K_384 FOLD_K(0x1c291d04u, 0x1d82c63daull)
#define K_256 FOLD_K(0x1384aa63aull, 0xba4fc28eu)
#define K_128 FOLD_K(0xf20c0dfeu, 0x14cd00bd6ull)

/* The remainder of the folded last block ``r`` (16 bytes), carried on by crc_hw over the ``n``
 * bytes left at ``p`` (fewer than one step).  The wide registers' upper halves are cleared first
 * (the compiler leaves them set for a tail call): legacy SSE code run after them, the
 * interpreter's, would take a merge per instruction, 150 ns a call here. */
__attribute__((target("avx,sse4.2"), always_inline)) static inline uint32_t
fold_finish(__m128i r, const unsigned char *p, size_t n)
{
    uint64_t first = (uint64_t)_mm_cvtsi128_si64(r), second = (uint64_t)_mm_extract_epi64(r, 1);
    _mm256_zeroupper();
    return crc_hw((uint32_t)_mm_crc32_u64(_mm_crc32_u64(0, first), second), p, n);
}

/* ``acc`` folded forward by the distance the constants ``k`` are for, XORed into ``data``. */
__attribute__((target("avx512f,vpclmulqdq"), always_inline)) static inline __m512i
fold_512(__m512i acc, __m512i k, __m512i data)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11),
                                     data, 0x96);
}

__attribute__((target("avx2,vpclmulqdq"), always_inline)) static inline __m256i
fold_256(__m256i acc, __m256i k, __m256i data)
{
    return _mm256_xor_si256(
        _mm256_xor_si256(_mm256_clmulepi64_epi128(acc, k, 0x00), _mm256_clmulepi64_epi128(acc, k, 0x11)), data);
}

/* crc_hw's result for ``n`` >= CRC_FOLD_MIN bytes, folded in four 64-byte registers, 256 bytes a
 * step.  The state ``c`` is XORed into the first four bytes: the CRC's state is linear that way. */
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) static uint32_t
crc_fold512(uint32_t c, const unsigned char *p, size_t n)
{
    const __m512i k2048 = _mm512_broadcast_i32x4(K_2048), k512 = _mm512_broadcast_i32x4(K_512);
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, (long long)c));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = fold_512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold_512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold_512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold_512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    x3 = fold_512(fold_512(fold_512(x0, k512, x1), k512, x2), k512, x3);
    /* x3's four blocks into its last: the first three folded 384, 256 and 128 bits forward */
    const __m512i lanes = _mm512_inserti32x4(
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_setzero_si512(), K_384, 0), K_256, 1), K_128, 2);
    __m512i t = _mm512_xor_si512(_mm512_clmulepi64_epi128(x3, lanes, 0x00), _mm512_clmulepi64_epi128(x3, lanes, 0x11));
    return fold_finish(_mm_xor_si128(_mm_xor_si128(_mm512_extracti32x4_epi32(t, 0), _mm512_extracti32x4_epi32(t, 1)),
                                     _mm_xor_si128(_mm512_extracti32x4_epi32(t, 2), _mm512_extracti32x4_epi32(x3, 3))),
                       p, n);
}

/* The same in four 32-byte registers, 128 bytes a step: for cores with VPCLMULQDQ but without
 * AVX-512 (AMD's Zen 3, Intel's client cores since Alder Lake). */
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2"))) static uint32_t
crc_fold256(uint32_t c, const unsigned char *p, size_t n)
{
    const __m256i k1024 = _mm256_broadcastsi128_si256(K_1024), k256 = _mm256_broadcastsi128_si256(K_256);
    __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set_epi64x(0, 0, 0, (long long)c));
    __m256i x1 = _mm256_loadu_si256((const __m256i *)(p + 32)), x2 = _mm256_loadu_si256((const __m256i *)(p + 64));
    __m256i x3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    for (p += 128, n -= 128; n >= 128; p += 128, n -= 128) {
        x0 = fold_256(x0, k1024, _mm256_loadu_si256((const __m256i *)p));
        x1 = fold_256(x1, k1024, _mm256_loadu_si256((const __m256i *)(p + 32)));
        x2 = fold_256(x2, k1024, _mm256_loadu_si256((const __m256i *)(p + 64)));
        x3 = fold_256(x3, k1024, _mm256_loadu_si256((const __m256i *)(p + 96)));
    }
    x3 = fold_256(fold_256(fold_256(x0, k256, x1), k256, x2), k256, x3);
    const __m128i k128 = K_128, first = _mm256_castsi256_si128(x3);
    return fold_finish(_mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(first, k128, 0x00),
                                                   _mm_clmulepi64_si128(first, k128, 0x11)),
                                     _mm256_extracti128_si256(x3, 1)),
                       p, n);
}
#endif

enum { CRC_TABLE, CRC_STREAMS, CRC_FOLD256, CRC_FOLD512 };
static const char *const crc_kernel_names[] = {"table", "streams", "fold256", "fold512"};
static int crc_kernel = CRC_TABLE;         /* the best this machine has (crc_detect) */
static unsigned crc_kernels = 1u << CRC_TABLE; /* all it has, a bit each */

/* The CRC-32C state ``c`` (not inverted) carried over ``n`` more bytes by ``kernel``. */
static inline uint32_t
crc_with(int kernel, uint32_t c, const unsigned char *p, size_t n)
{
#ifdef HAVE_FOLD_CRC
    if (kernel >= CRC_FOLD256 && n >= CRC_FOLD_MIN) {
        return kernel == CRC_FOLD512 ? crc_fold512(c, p, n) : crc_fold256(c, p, n);
    }
#endif
#ifdef HAVE_HW_CRC
    if (kernel != CRC_TABLE) {
        return crc_hw(c, p, n);
    }
#endif
    return crc_sw(c, p, n);
}

/* The CRC-32C state ``c`` (not inverted) carried over ``n`` more bytes. */
static inline uint32_t
crc_update(uint32_t c, const unsigned char *p, size_t n)
{
    return crc_with(crc_kernel, c, p, n);
}

/* CRC-32C of ``n`` bytes. */
static uint32_t
crc32c(const unsigned char *p, size_t n)
{
    return ~crc_update(0xFFFFFFFFu, p, n);
}

static void
crc_detect(void)
{
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    crc_kernels |= (unsigned)(__builtin_cpu_supports("sse4.2") != 0) << CRC_STREAMS;
#ifdef HAVE_FOLD_CRC
    /* (the AVX checks include the operating system's: that it saves the wide registers) */
    if ((crc_kernels & (1u << CRC_STREAMS)) && __builtin_cpu_supports("vpclmulqdq") &&
        __builtin_cpu_supports("pclmul")) {
        crc_kernels |= (unsigned)(__builtin_cpu_supports("avx2") != 0) << CRC_FOLD256;
        crc_kernels |= (unsigned)(__builtin_cpu_supports("avx512f") != 0) << CRC_FOLD512;
    }
#endif
#endif
    for (int kernel = CRC_TABLE; kernel <= CRC_FOLD512; kernel++) {
        if (crc_kernels & (1u << kernel)) {
            crc_kernel = kernel;
        }
    }
}

static PyObject *
crc32c_py(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t c = crc32c((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *
crc32c_kernel_py(PyObject *module, PyObject *args)
{
    const char *name;
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "sy*|I:crc32c_kernel", &name, &view, &value)) {
        return NULL;
    }
    for (int kernel = CRC_TABLE; kernel <= CRC_FOLD512; kernel++) {
        if ((crc_kernels & (1u << kernel)) && strcmp(name, crc_kernel_names[kernel]) == 0) {
            uint32_t c = crc_with(kernel, ~(uint32_t)value, (const unsigned char *)view.buf, (size_t)view.len);
            PyBuffer_Release(&view);
            return PyLong_FromUnsignedLong(~c);
        }
    }
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError, "no CRC-32C kernel %R on this machine (see CRC32C_KERNELS)", PyTuple_GET_ITEM(args, 0));
    return NULL;
}

PyDoc_STRVAR(crc32c_kernel_doc,
             "crc32c_kernel(name, data, value=0) -> int\n\n"
             "CRC-32C of ``data`` by one kernel of CRC32C_KERNELS (\"fold512\", \"fold256\", \"streams\",\n"
             "\"table\"), continuing from the CRC-32C ``value`` of the bytes before it; for tests.");

PyDoc_STRVAR(crc32c_doc,
             "crc32c(data) -> int\n\n"
             "CRC-32C of a bytes-like object (the record batch checksum), as the column walk computes it.");

/* ------------------------------------------------------------------ columnar decoding
 *
 * ColumnBuilder(topic, partition, headers=True, max_offset=2**31 - 1, allocate=None)
 * accumulates the records of the batches given to ``append`` as Arrow-ready column buffers, with
 * no Python object per record:
 *
 *     offsets int64, timestamps int64 (ms), timestamp types int32,
 *     key and value: int32 offsets (n + 1), data, validity bitmap (LSB first) and null count,
 *     headers (list<struct<key: string, value: binary>>): int32 list offsets (n + 1), and for
 *     the n_h headers: key offsets (n_h + 1) + UTF-8 data, value offsets + data + validity.
 *
 * append(batch, start) -> stored parses the batch and stores its records at offset >= start:
 * all of them or, on any error, none (the builder goes back to where it was).  It returns None,
 * storing nothing, when they do not fit: when an int32 offset column would pass ``max_offset``;
 * the batch is parsed to its end all the same, so a corrupt batch raises rather than that.
 * Legacy message sets, values beyond 64 bits and non-buffer data go through the Python row
 * decoder (``fallback``), whose records are then stored the same way.  finish() hands the
 * buffers out as a tuple (see protocol/columnar.py ``ColumnBuffers``); the builder is spent then.
 * walk(records, pos, start, limit, check_crcs, read_committed) does append's work for a run of
 * plain batches of a record set in one call (see builder_walk_locked for where it stops).
 * Both read a batch's common records (no headers, room in the buffers, 64 bytes or more before
 * the batch's end) in an unchecked loop (columns_fast), and everything else in the checked one
 * (parse_columns), which also gives every error: the two store the same bytes.
 * reserve(records, data) sizes the buffers up front: ColumnReader passes the bytes of the
 * uncompressed batches a block may take, which bound its key and value bytes, so that copying
 * the records does not reallocate (a reallocation copies the whole old capacity).
 *
 * Each buffer is a bytearray, or with ``allocate`` whatever ``allocate(size)`` returns: an object
 * exporting a writable buffer of at least ``size`` bytes whose memory stays where it is while the
 * object lives (a memoryview from a buffer pool, engine/buffers.py; pyarrow's ``allocate_buffer``).
 * Growing such a buffer asks for a new one and copies the bytes; finish() hands out ``obj[:len]``
 * when the buffer is longer than the column, or a bytearray copy when the column takes at most a
 * quarter of it (so that a short column does not keep a large buffer from being used again).
 * append, reserve and finish raise RuntimeError when called again while one of them runs (from
 * ``allocate`` or another thread).  An allocator that keeps its memory between blocks
 * (the pool) spares the page faults of fresh memory, which cost more than copying the records.
 */

enum {
    B_OFFSETS,
    B_TIMESTAMPS,
    B_TS_TYPES,
    B_KEY_OFFSETS,
    B_KEY_DATA,
    B_KEY_VALID,
    B_VALUE_OFFSETS,
    B_VALUE_DATA,
    B_VALUE_VALID,
    B_HDR_OFFSETS, /* the header buffers exist only with headers=True */
    B_HKEY_OFFSETS,
    B_HKEY_DATA,
    B_HVALUE_OFFSETS,
    B_HVALUE_DATA,
    B_HVALUE_VALID,
    NBUFS,
};
#define FIRST_HEADER_BUF B_HDR_OFFSETS
#define ERR_FULL 4 /* not a failure: the record does not fit under max_offset */

typedef struct {
    PyObject *obj; /* a bytearray or an ``allocate``d buffer; its size is the capacity while building */
    char *p;
    Py_ssize_t cap;
    PyObject *allocate; /* borrowed from the builder (which holds it); NULL: bytearrays only */
    Py_ssize_t min_allocate; /* smaller capacities stay a bytearray, grown in place */
    int external;       /* obj came from ``allocate`` (else it is the first, small bytearray) */
} colbuf;

/* What append() rolls back to.  Everything else is a function of these. */
typedef struct {
    Py_ssize_t n, nh;
    Py_ssize_t key_nulls, value_nulls, hvalue_nulls;
    Py_ssize_t key_len, value_len, hkey_len, hvalue_len;
    Py_ssize_t ts_beyond; /* the first record whose timestamp has no microseconds in int64, or -1 */
    int64_t ts_beyond_ms; /* its timestamp */
} colstate;

/* The timestamps are stored as Arrow's microseconds: Kafka's milliseconds times 1000.  Those
 * beyond +-TS_MS_LIMIT have none in int64 (about 292,000 years from 1970); their slot holds
 * TS_BEYOND, which no millisecond count gives. */
#define TS_MS_LIMIT (INT64_MAX / 1000)
#define TS_BEYOND INT64_MIN

typedef struct {
    PyObject_HEAD
    PyObject *topic;
    PyObject *partition;
    PyObject *allocate; /* NULL: bytearrays */
    int headers;
    int finished;
    int busy; /* in append/reserve/finish: ``allocate`` runs Python code, which must not call back in */
    Py_ssize_t max_offset;
    Py_ssize_t key_reserve; /* the capacity reserve() set aside for keys, taken at the first key byte */
    colstate s;
    colbuf b[NBUFS];
} ColumnBuilder;

/* A new ``allocate``d buffer of at least ``size`` bytes: where its memory is and how long it is. */
static PyObject *
colbuf_allocate(PyObject *allocate, Py_ssize_t size, char **p, Py_ssize_t *len)
{
    PyObject *obj = PyObject_CallFunction(allocate, "n", size);
    if (obj == NULL) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    *p = (char *)view.buf;
    *len = view.len;
    PyBuffer_Release(&view); /* the object keeps its memory where it is while it lives */
    if (*len < size) {
        Py_DECREF(obj);
        PyErr_SetString(PyExc_ValueError, "allocate() gave a buffer smaller than asked for");
        return NULL;
    }
    return obj;
}

/* The first, small buffer is a bytearray even with ``allocate``: most columns of a block never
 * outgrow it, and a call into Python per column would cost more than it saves. */
static int
colbuf_init(colbuf *b, PyObject *allocate, Py_ssize_t min_allocate, Py_ssize_t cap)
{
    b->allocate = allocate;
    b->min_allocate = min_allocate;
    b->external = 0;
    b->cap = cap;
    b->obj = PyByteArray_FromStringAndSize(NULL, cap);
    b->p = b->obj == NULL ? NULL : PyByteArray_AS_STRING(b->obj);
    return b->obj == NULL ? -1 : 0;
}

/* Capacity ``size`` (more than now): a bytearray is resized (also with ``allocate``, below
 * ``min_allocate``: a call into Python and a cleared buffer per small column cost more than the
 * column), an ``allocate``d buffer replaced by a new one holding the same bytes. */
static int
colbuf_resize(colbuf *b, Py_ssize_t size)
{
    if (b->allocate == NULL || (!b->external && size < b->min_allocate)) {
        if (PyByteArray_Resize(b->obj, size) < 0) {
            return -1;
        }
        b->p = PyByteArray_AS_STRING(b->obj);
    }
    else {
        char *p;
        PyObject *obj = colbuf_allocate(b->allocate, size, &p, &size); /* all of it: it may be more */
        if (obj == NULL) {
            return -1;
        }
        memcpy(p, b->p, (size_t)b->cap);
        Py_SETREF(b->obj, obj);
        b->p = p;
        b->external = 1;
    }
    b->cap = size;
    return 0;
}

static int
colbuf_grow(colbuf *b, Py_ssize_t need)
{
    Py_ssize_t cap = b->cap > PY_SSIZE_T_MAX / 2 ? PY_SSIZE_T_MAX : b->cap * 2;
    return colbuf_resize(b, cap < need ? need : cap);
}

/* Capacity for exactly ``need`` bytes when there is less (a size known up front: no doubling). */
static inline int
colbuf_reserve_exact(colbuf *b, Py_ssize_t need)
{
    return need <= b->cap ? 0 : colbuf_resize(b, need);
}

static inline int
colbuf_reserve(colbuf *b, Py_ssize_t need)
{
    return need <= b->cap ? 0 : colbuf_grow(b, need);
}

static inline void
put_i64(colbuf *b, Py_ssize_t i, int64_t v)
{
    memcpy(b->p + i * 8, &v, 8);
}

static inline void
put_i32(colbuf *b, Py_ssize_t i, int32_t v)
{
    memcpy(b->p + i * 4, &v, 4);
}

/* Bit i of a validity bitmap (LSB first); a byte is written whole when its first bit is. */
static inline void
put_bit(colbuf *b, Py_ssize_t i, int valid)
{
    unsigned char *byte = (unsigned char *)b->p + (i >> 3);
    unsigned char mask = (unsigned char)(1u << (i & 7));
    if ((i & 7) == 0) {
        *byte = valid ? 1 : 0;
    }
    else if (valid) {
        *byte |= mask;
    }
    else {
        *byte &= (unsigned char)~mask;
    }
}

/* Bit i of a validity bitmap cleared, the others left as they are. */
static inline void
clear_bit(colbuf *b, Py_ssize_t i)
{
    ((unsigned char *)b->p)[i >> 3] &= (unsigned char)~(1u << (i & 7));
}

/* Room for ``count`` more records in the per-record buffers. */
static int
reserve_records(ColumnBuilder *cb, Py_ssize_t count)
{
    Py_ssize_t n = cb->s.n + count;
    if (colbuf_reserve(&cb->b[B_OFFSETS], n * 8) < 0 || colbuf_reserve(&cb->b[B_TIMESTAMPS], n * 8) < 0 ||
        colbuf_reserve(&cb->b[B_TS_TYPES], n * 4) < 0 || colbuf_reserve(&cb->b[B_KEY_OFFSETS], (n + 1) * 4) < 0 ||
        colbuf_reserve(&cb->b[B_VALUE_OFFSETS], (n + 1) * 4) < 0 ||
        colbuf_reserve(&cb->b[B_KEY_VALID], n / 8 + 1) < 0 || colbuf_reserve(&cb->b[B_VALUE_VALID], n / 8 + 1) < 0) {
        return -1;
    }
    if (cb->headers && colbuf_reserve(&cb->b[B_HDR_OFFSETS], (n + 1) * 4) < 0) {
        return -1;
    }
    return 0;
}

/* Room for ``more`` bytes of keys and of values beyond what is stored, each capped at
 * max_offset (what a block can hold), allocated exactly: a size known up front.  The keys' room
 * is only noted, and allocated when a key needs it (put_data): most records have no key, or a
 * short one, and a buffer of the values' size for them was one more pool request a block. */
static int
reserve_data(ColumnBuilder *cb, Py_ssize_t more)
{
    Py_ssize_t keys = more > cb->max_offset - cb->s.key_len ? cb->max_offset : cb->s.key_len + more;
    if (keys > cb->key_reserve) {
        cb->key_reserve = keys;
    }
    Py_ssize_t values = more > cb->max_offset - cb->s.value_len ? cb->max_offset : cb->s.value_len + more;
    return colbuf_reserve_exact(&cb->b[B_VALUE_DATA], values);
}

/* Append len bytes to a data buffer; ERR_FULL when its offsets would pass max_offset. */
static inline int
put_data(ColumnBuilder *cb, int which, Py_ssize_t *used, const unsigned char *at, Py_ssize_t len)
{
    if (len > cb->max_offset - *used) {
        return ERR_FULL;
    }
    colbuf *b = &cb->b[which];
    Py_ssize_t need = *used + len;
    if (need > b->cap) {
        int r;
        if (which == B_KEY_DATA && cb->key_reserve > need) {
            /* The records the block has room for at twice this key's length, within the room
             * reserve_data noted: a column of short keys then fits a buffer of its size. */
            Py_ssize_t room = cb->key_reserve - need, records = cb->b[B_OFFSETS].cap / 8 - cb->s.n;
            Py_ssize_t more = len > 0 && records > 0 && records <= room / (2 * len) ? records * 2 * len : room;
            r = colbuf_resize(b, need + more); /* more than the capacity: need is */
        }
        else {
            r = colbuf_grow(b, need);
        }
        if (r < 0) {
            return ERR_PYTHON;
        }
    }
    if (len > 0) {
        memcpy(b->p + *used, at, (size_t)len);
    }
    *used += len;
    return OK;
}

/* One header of the record being stored (its key is UTF-8 already). */
static int
put_header(ColumnBuilder *cb, const unsigned char *key, Py_ssize_t klen, const unsigned char *value, Py_ssize_t vlen)
{
    colstate *s = &cb->s;
    if (s->nh >= cb->max_offset) { /* the list offsets count headers */
        return ERR_FULL;
    }
    Py_ssize_t nh = s->nh + 1;
    if (colbuf_reserve(&cb->b[B_HKEY_OFFSETS], (nh + 1) * 4) < 0 ||
        colbuf_reserve(&cb->b[B_HVALUE_OFFSETS], (nh + 1) * 4) < 0 ||
        colbuf_reserve(&cb->b[B_HVALUE_VALID], nh / 8 + 1) < 0) {
        return ERR_PYTHON;
    }
    int r = put_data(cb, B_HKEY_DATA, &s->hkey_len, key, klen);
    if (r == OK && value != NULL) {
        r = put_data(cb, B_HVALUE_DATA, &s->hvalue_len, value, vlen);
    }
    if (r != OK) {
        return r;
    }
    put_bit(&cb->b[B_HVALUE_VALID], s->nh, value != NULL);
    if (value == NULL) {
        s->hvalue_nulls++;
    }
    put_i32(&cb->b[B_HKEY_OFFSETS], nh, (int32_t)s->hkey_len);
    put_i32(&cb->b[B_HVALUE_OFFSETS], nh, (int32_t)s->hvalue_len);
    s->nh = nh;
    return OK;
}

/* A header key exactly as the row decoders turn it into a str (malformed UTF-8 becomes
 * U+FFFD), then stored as UTF-8. */
static int
put_header_key_value(ColumnBuilder *cb, const unsigned char *key, Py_ssize_t klen, const unsigned char *value,
                     Py_ssize_t vlen)
{
    for (Py_ssize_t i = 0; i < klen; i++) {
        if (key[i] >= 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)key, klen, "replace");
            if (text == NULL) {
                return ERR_PYTHON;
            }
            Py_ssize_t len;
            const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
            int r = utf8 == NULL ? ERR_PYTHON : put_header(cb, (const unsigned char *)utf8, len, value, vlen);
            Py_DECREF(text);
            return r;
        }
    }
    return put_header(cb, key, klen, value, vlen);
}

/* Marks records ``first`` .. ``first + count - 1`` valid in a bitmap with room for them (the bits
 * before ``first`` stay): a batch's records are then only cleared when null (put_record_fields). */
static void
prefill_valid(colbuf *b, Py_ssize_t first, Py_ssize_t count)
{
    if (count <= 0) {
        return;
    }
    unsigned char *p = (unsigned char *)b->p;
    Py_ssize_t last = (first + count - 1) >> 3;
    p[first >> 3] |= (unsigned char)(0xFFu << (first & 7));
    if (last > first >> 3) {
        memset(p + (first >> 3) + 1, 0xFF, (size_t)(last - (first >> 3)));
    }
}

/* ``v`` in int32 slots ``first`` .. ``end - 1``. */
static void
fill_i32(colbuf *b, Py_ssize_t first, Py_ssize_t end, int32_t v)
{
    int32_t *p = (int32_t *)(void *)b->p;
    for (Py_ssize_t i = first; i < end; i++) {
        p[i] = v;
    }
}

/* The record's key, value, offset and timestamp (its headers are stored already); reserve_records
 * made room for it.  Its validity bits are only cleared for a null key or value, and its
 * timestamp type is not stored: parse_columns fills those for the whole batch, put_record for
 * one record. */
HOT int
put_record_fields(ColumnBuilder *cb, int64_t offset, int64_t ts, const unsigned char *key, Py_ssize_t klen,
                  const unsigned char *value, Py_ssize_t vlen)
{
    colstate *s = &cb->s;
    Py_ssize_t i = s->n;
    int r = OK;
    if (key != NULL) {
        r = put_data(cb, B_KEY_DATA, &s->key_len, key, klen);
    }
    if (r == OK && value != NULL) {
        r = put_data(cb, B_VALUE_DATA, &s->value_len, value, vlen);
    }
    if (r != OK) {
        return r;
    }
    put_i64(&cb->b[B_OFFSETS], i, offset);
    if (ts > TS_MS_LIMIT || ts < -TS_MS_LIMIT) {
        if (s->ts_beyond < 0) {
            s->ts_beyond = i;
            s->ts_beyond_ms = ts;
        }
        put_i64(&cb->b[B_TIMESTAMPS], i, TS_BEYOND);
    }
    else {
        put_i64(&cb->b[B_TIMESTAMPS], i, ts * 1000);
    }
    if (key == NULL) {
        clear_bit(&cb->b[B_KEY_VALID], i);
        s->key_nulls++;
    }
    if (value == NULL) {
        clear_bit(&cb->b[B_VALUE_VALID], i);
        s->value_nulls++;
    }
    put_i32(&cb->b[B_KEY_OFFSETS], i + 1, (int32_t)s->key_len);
    put_i32(&cb->b[B_VALUE_OFFSETS], i + 1, (int32_t)s->value_len);
    if (cb->headers) {
        put_i32(&cb->b[B_HDR_OFFSETS], i + 1, (int32_t)s->nh);
    }
    s->n = i + 1;
    return OK;
}

/* One record, all of its fields (put_rows: the rows of the Python decoder). */
static int
put_record(ColumnBuilder *cb, int64_t offset, int64_t ts, int32_t ts_type, const unsigned char *key,
           Py_ssize_t klen, const unsigned char *value, Py_ssize_t vlen)
{
    Py_ssize_t i = cb->s.n;
    put_bit(&cb->b[B_KEY_VALID], i, key != NULL);
    put_bit(&cb->b[B_VALUE_VALID], i, value != NULL);
    int r = put_record_fields(cb, offset, ts, key, klen, value, vlen);
    if (r == OK) {
        put_i32(&cb->b[B_TS_TYPES], i, ts_type);
    }
    return r;
}

/* Would a record with this much key and value data fit?  (Headers are checked as stored.) */
static inline int
record_fits(ColumnBuilder *cb, Py_ssize_t klen, Py_ssize_t vlen)
{
    return klen <= cb->max_offset - cb->s.key_len && vlen <= cb->max_offset - cb->s.value_len;
}

typedef struct {
    int64_t start;
    Py_ssize_t stored;
    int full; /* a record did not fit: nothing more is stored, the batch will be rolled back */
} store_plan;

/* Whether the record at ``offset`` is stored. */
static inline int
plan_record(store_plan *plan, ColumnBuilder *cb, int64_t offset, Py_ssize_t klen, Py_ssize_t vlen)
{
    if (offset < plan->start || plan->full) {
        return 0;
    }
    if (!record_fits(cb, klen, vlen)) {
        plan->full = 1;
        return 0;
    }
    return 1;
}

typedef struct {
    int64_t count;
    int64_t base_offset;
    int64_t base_timestamp;
    int64_t log_append_ts; /* max_timestamp */
    int log_append_time;
    int32_t timestamp_type;
} col_batch;

/* A batch's CRC-32C taken as its records are parsed: the bytes from ``at`` up to the parser's
 * position are not in ``c`` yet. */
typedef struct {
    uint32_t c;
    Py_ssize_t at;
} crc_run;

/* Bytes parsed before they are added to a running CRC: they are still in the L1 cache then. */
#define CRC_CHUNK (16 << 10)

/* The running CRC carried up to ``pos`` of ``buf`` (the parser's position). */
static inline void
crc_run_to(crc_run *crc, const unsigned char *buf, Py_ssize_t pos)
{
    crc->c = crc_update(crc->c, buf + crc->at, (size_t)(pos - crc->at));
    crc->at = pos;
}

/* How far ahead of the record being parsed its batch is fetched into the caches: the parser reads
 * each record's fields in a chain (every length says where the next field is), so a record's
 * bytes that are not cached yet stall it, and the hardware prefetcher alone left a quarter of the
 * parse waiting on the byte after each value (a fetch response of 100 B records, read from
 * memory).  Only addresses inside the batch are given. */
#define PREFETCH_AHEAD 256
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(at) __builtin_prefetch(at)
#else
#define PREFETCH(at) ((void)0)
#endif

/* The common record, read without a check per byte (columns_fast).  A record is taken this way
 * when it ends FAST_SLACK bytes or more before its batch does: then its varints (9 bytes at most
 * here, up to four in a row past the record's end when its length lies) and the chunks its key and
 * value are copied in (copy_chunks) stay inside the batch. */
#define FAST_SLACK 64
/* The most records parse_columns reads in its checked loop before trying columns_fast again. */
#define FAST_BACKOFF_MAX 64

/* A zigzag varint of at most 9 bytes at ``q``, unchecked (the caller keeps 9 bytes readable):
 * where the next field starts, or NULL for a longer one (the checked parser reads that). */
static inline const unsigned char *
fast_varint(const unsigned char *q, int64_t *out)
{
    uint64_t b = q[0];
    if (b < 0x80) {
        *out = unzigzag(b);
        return q + 1;
    }
    uint64_t v = b & 0x7F;
    b = q[1];
    if (b < 0x80) { /* two bytes: a record length, or an offset delta up to 8191 */
        *out = unzigzag(v | b << 7);
        return q + 2;
    }
    v |= (b & 0x7F) << 7;
    for (int i = 2; i < 9; i++) {
        b = q[i];
        v |= (b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = unzigzag(v);
            return q + i + 1;
        }
    }
    return NULL;
}

/* ``len`` bytes from ``src`` to ``dst`` in chunks of COPY_CHUNK bytes: up to COPY_CHUNK - 1
 * bytes past the end of each are read and written, which the caller keeps inside the batch and
 * the buffer. */
#define COPY_CHUNK 32
static inline void
copy_chunks(char *dst, const unsigned char *src, Py_ssize_t len)
{
    for (Py_ssize_t at = 0; at < len; at += COPY_CHUNK) {
        memcpy(dst + at, src + at, COPY_CHUNK);
    }
}

/* Record ``i``'s key or value into its column (columns_fast, with the column's state in its
 * locals): copied after the ``used`` bytes before it, or, for a null (``len`` -1), its validity
 * bit cleared and counted. */
static inline void
put_fast(char *data, Py_ssize_t *used, unsigned char *valid, Py_ssize_t *nulls, Py_ssize_t i,
         const unsigned char *at, int64_t len)
{
    if (len >= 0) {
        copy_chunks(data + *used, at, (Py_ssize_t)len);
        *used += (Py_ssize_t)len;
    }
    else {
        valid[i >> 3] &= (unsigned char)~(1u << (i & 7));
        (*nulls)++;
    }
}

/* A key or value length that is -1 (null) or fits in ``room`` (which is negative when the
 * fields before already ran past the record's end: then only a null passes, and the record's end
 * is found wrong after). */
static inline int
length_ok(int64_t len, Py_ssize_t room)
{
    return len >= -1 && len <= room;
}

/* parse_columns' loop for a run of common records: no headers, keys and values that fit the
 * room the buffers have (with COPY_CHUNK bytes to spare), timestamps Arrow's microseconds hold.
 * The state lives in locals (a store through ``char *`` would make the compiler reload every
 * field of the builder after it) and is written back at the end.  Any other record, or any doubt
 * (a varint of 10 bytes, a length that does not add up, an offset beyond 64 bits), ends the run
 * with the parser at that record's start, for parse_columns' checked loop to read and report
 * exactly.  Fields may be read past a record's end before its length is found wrong: never past
 * FAST_SLACK, and nothing of such a record is stored.  The caller has checked that every key and
 * value of the batch fits under max_offset.  Returns how many records it read. */
static int64_t
columns_fast(parser *p, ColumnBuilder *cb, const col_batch *bi, store_plan *plan, crc_run *crc, Py_ssize_t room,
             int64_t left)
{
    if (p->end - p->pos <= FAST_SLACK || plan->full) {
        return 0;
    }
    const unsigned char *const buf = p->buf;
    const unsigned char *q = buf + p->pos;
    const unsigned char *const limit = buf + p->end - FAST_SLACK;
    const unsigned char *const prefetch_end = buf + (p->end > PREFETCH_AHEAD ? p->end - PREFETCH_AHEAD : 0);
    /* where the CRC taken behind the parser next catches up (never without ``crc``) */
    const unsigned char *crc_next = crc != NULL ? buf + crc->at + CRC_CHUNK : buf + p->end;
    colstate *s = &cb->s;
    Py_ssize_t n = s->n, stored = plan->stored, key_len = s->key_len, value_len = s->value_len;
    Py_ssize_t key_nulls = s->key_nulls, value_nulls = s->value_nulls;
    char *const keys = cb->b[B_KEY_DATA].p, *const values = cb->b[B_VALUE_DATA].p;
    const Py_ssize_t key_room = cb->b[B_KEY_DATA].cap - COPY_CHUNK;
    const Py_ssize_t value_room = cb->b[B_VALUE_DATA].cap - COPY_CHUNK;
    char *const offsets = cb->b[B_OFFSETS].p, *const timestamps = cb->b[B_TIMESTAMPS].p;
    char *const key_offsets = cb->b[B_KEY_OFFSETS].p, *const value_offsets = cb->b[B_VALUE_OFFSETS].p;
    unsigned char *const key_valid = (unsigned char *)cb->b[B_KEY_VALID].p;
    unsigned char *const value_valid = (unsigned char *)cb->b[B_VALUE_VALID].p;
    char *const header_offsets = cb->headers ? cb->b[B_HDR_OFFSETS].p : NULL;
    const int32_t nh = (int32_t)s->nh;
    const int64_t start = plan->start, base_offset = bi->base_offset, base_timestamp = bi->base_timestamp;
    const int log_append_time = bi->log_append_time;
    int64_t done = 0;
    while (done < left && q < limit) {
        const unsigned char *const record = q;
        const unsigned char *end;
        int64_t length, ts_delta, offset_delta, klen, vlen, offset, ts;
        if (q < prefetch_end) {
            PREFETCH(q + PREFETCH_AHEAD);
        }
        if ((q = fast_varint(q, &length)) == NULL || length < 0 || length > limit - q) {
            goto checked;
        }
        end = q + length;
        q += 1; /* attributes: unused */
        if ((q = fast_varint(q, &ts_delta)) == NULL || (q = fast_varint(q, &offset_delta)) == NULL ||
            (q = fast_varint(q, &klen)) == NULL || !length_ok(klen, end - q)) {
            goto checked;
        }
        const unsigned char *const key = q;
        q += klen < 0 ? 0 : klen;
        if ((q = fast_varint(q, &vlen)) == NULL || !length_ok(vlen, end - q)) {
            goto checked;
        }
        const unsigned char *const value = q;
        q += vlen < 0 ? 0 : vlen;
        /* no headers (a count of one zero byte), and the record ends where its length says */
        if (q + 1 != end || *q != 0 || add_overflows(base_offset, offset_delta, &offset)) {
            goto checked;
        }
        q = end;
        if (log_append_time) {
            ts = bi->log_append_ts;
        }
        else if (add_overflows(base_timestamp, ts_delta, &ts)) {
            goto checked;
        }
        if (offset >= start) { /* stored (plan_record: every record fits, see the caller) */
            if (stored >= room || (uint64_t)ts + (uint64_t)TS_MS_LIMIT > 2 * (uint64_t)TS_MS_LIMIT ||
                klen > key_room - key_len || vlen > value_room - value_len) {
                goto checked; /* the checked loop grows the buffer, notes the timestamp or reports */
            }
            put_fast(keys, &key_len, key_valid, &key_nulls, n, key, klen);
            put_fast(values, &value_len, value_valid, &value_nulls, n, value, vlen);
            int64_t us = ts * 1000;
            int32_t kend = (int32_t)key_len, vend = (int32_t)value_len;
            memcpy(offsets + n * 8, &offset, 8);
            memcpy(timestamps + n * 8, &us, 8);
            memcpy(key_offsets + (n + 1) * 4, &kend, 4);
            memcpy(value_offsets + (n + 1) * 4, &vend, 4);
            if (header_offsets != NULL) {
                memcpy(header_offsets + (n + 1) * 4, &nh, 4);
            }
            n++;
            stored++;
        }
        done++;
        if (q >= crc_next) {
            crc_run_to(crc, buf, q - buf);
            crc_next = q + CRC_CHUNK;
        }
        continue;
    checked:
        q = record;
        break;
    }
    p->pos = q - buf;
    s->n = n;
    s->key_len = key_len;
    s->value_len = value_len;
    s->key_nulls = key_nulls;
    s->value_nulls = value_nulls;
    plan->stored = stored;
    return done;
}

/* The records section of a v2 batch into the builder, with parse_records' checks; with ``crc``,
 * the batch's CRC is taken along (behind the parser, a chunk at a time). */
static int
parse_columns(parser *p, ColumnBuilder *cb, const col_batch *bi, store_plan *plan, crc_run *crc)
{
    int status;
    /* A record takes at least 7 bytes: no more than this many can parse. */
    Py_ssize_t room = (p->end - p->pos) / 7;
    Py_ssize_t n = bi->count < 0 ? 0 : (bi->count < (int64_t)room ? (Py_ssize_t)bi->count : room);
    if (reserve_records(cb, n) < 0) {
        return ERR_PYTHON;
    }
    const Py_ssize_t first = cb->s.n;
    prefill_valid(&cb->b[B_KEY_VALID], first, n);
    prefill_valid(&cb->b[B_VALUE_VALID], first, n);
    /* The batch's keys and values, each at most its bytes, fit under max_offset: no record can be
     * full, and columns_fast may take the common ones. */
    const Py_ssize_t bytes = p->end - p->pos;
    const int fast = bytes <= cb->max_offset - cb->s.key_len && bytes <= cb->max_offset - cb->s.value_len;
    /* columns_fast is tried again at record ``retry``: at once after a run it read, and after
     * FAST_BACKOFF_MAX records at most while it reads none (records with headers, each read
     * twice up to its header count otherwise). */
    int64_t retry = 0, backoff = 1;
    for (int64_t i = 0; i < bi->count; i++) {
        if (fast && i >= retry) {
            int64_t took = columns_fast(p, cb, bi, plan, crc, n, bi->count - i);
            if ((i += took) >= bi->count) {
                break;
            }
            backoff = took > 0 ? 1 : (backoff < FAST_BACKOFF_MAX ? backoff * 2 : FAST_BACKOFF_MAX);
            retry = i + (took > 0 ? 1 : backoff);
        }
        record_head r;
        int64_t nheaders;
        if (p->end - p->pos > PREFETCH_AHEAD) {
            PREFETCH(p->buf + p->pos + PREFETCH_AHEAD);
        }
        r.ts = bi->log_append_ts;
        if ((status = read_record_head(p, bi->base_offset, bi->base_timestamp, bi->log_append_time, &r)) != OK ||
            (status = read_header_count(p, &nheaders)) != OK) {
            return status;
        }
        int store = plan_record(plan, cb, r.offset, r.key == NULL ? 0 : (Py_ssize_t)r.klen,
                                r.value == NULL ? 0 : (Py_ssize_t)r.vlen);
        int keep = store && cb->headers;
        for (int64_t h = 0; h < nheaders; h++) {
            const unsigned char *hkey, *hvalue;
            Py_ssize_t hklen, hvlen;
            if ((status = read_header(p, &hkey, &hklen, &hvalue, &hvlen)) != OK) {
                return status;
            }
            if (keep) {
                status = put_header_key_value(cb, hkey, hklen, hvalue, hvlen);
                if (status == ERR_PYTHON) {
                    return status;
                }
                if (status == ERR_FULL) {
                    plan->full = 1;
                    keep = store = 0;
                }
            }
        }
        if ((status = check_record_end(p, &r)) != OK) {
            return status;
        }
        if (store) {
            if (plan->stored >= n) { /* unreachable: see ``room`` */
                PyOS_snprintf(p->err, ERRBUF, "record runs past the end of the batch");
                return ERR_CORRUPT;
            }
            /* record_fits() said the key and value fit: put_record cannot be full. */
            if (put_record_fields(cb, r.offset, r.ts, r.key, (Py_ssize_t)r.klen, r.value, (Py_ssize_t)r.vlen) !=
                OK) {
                return ERR_PYTHON;
            }
            plan->stored++;
        }
        if (crc != NULL && p->pos - crc->at >= CRC_CHUNK) {
            crc_run_to(crc, p->buf, p->pos);
        }
    }
    fill_i32(&cb->b[B_TS_TYPES], first, cb->s.n, bi->timestamp_type);
    return check_batch_end(p, bi->count);
}

/* An int field of a row from the Python decoder as int64; ``overflow`` is -1 or 1 (and the
 * value unusable) when it does not fit. */
static int
row_int64(PyObject *obj, int64_t *out, int *overflow)
{
    long long v = PyLong_AsLongLongAndOverflow(obj, overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int
bytes_or_none(PyObject *obj, const unsigned char **at, Py_ssize_t *len)
{
    if (obj == Py_None) {
        *at = NULL;
        *len = 0;
        return 0;
    }
    char *buf;
    if (PyBytes_AsStringAndSize(obj, &buf, len) < 0) {
        return -1;
    }
    *at = (const unsigned char *)buf;
    return 0;
}

/* Store the rows the Python decoder made of a batch, with the plan of the native path.  Offsets
 * and timestamps beyond 64 bits (only corrupt batches have them) raise CorruptRecordError. */
static int
put_rows(ColumnBuilder *cb, PyObject *rows, store_plan *plan, int64_t base_offset)
{
    if (!PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "the row decoder did not return a list");
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(rows);
    if (reserve_records(cb, count) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != RECORD_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "the row decoder returned something other than a ConsumerRecord");
            return -1;
        }
        int64_t offset, ts = 0, ts_type;
        int overflow;
        PyObject *bad = NULL;
        const char *what = "offset";
        if (row_int64(PyTuple_GET_ITEM(row, 2), &offset, &overflow) < 0) {
            return -1;
        }
        if (overflow < 0) {
            continue; /* before any start offset */
        }
        if (overflow > 0) {
            bad = PyTuple_GET_ITEM(row, 2);
        }
        else if (offset < plan->start) {
            continue;
        }
        else {
            if (row_int64(PyTuple_GET_ITEM(row, 3), &ts, &overflow) < 0) {
                return -1;
            }
            if (overflow) {
                what = "timestamp";
                bad = PyTuple_GET_ITEM(row, 3);
            }
        }
        if (bad != NULL) {
            PyObject *detail = PyUnicode_FromFormat("%s %S does not fit in 64 bits", what, bad);
            if (detail != NULL) {
                raise_corrupt_obj(detail, cb->topic, cb->partition, base_offset);
                Py_DECREF(detail);
            }
            return -1;
        }
        if (row_int64(PyTuple_GET_ITEM(row, 4), &ts_type, &overflow) < 0) {
            return -1;
        }
        if (overflow || ts_type < INT32_MIN || ts_type > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "timestamp type out of range");
            return -1;
        }
        const unsigned char *key, *value;
        Py_ssize_t klen, vlen;
        if (bytes_or_none(PyTuple_GET_ITEM(row, 5), &key, &klen) < 0 ||
            bytes_or_none(PyTuple_GET_ITEM(row, 6), &value, &vlen) < 0) {
            return -1;
        }
        if (!plan_record(plan, cb, offset, klen, vlen)) {
            continue;
        }
        PyObject *headers = PyTuple_GET_ITEM(row, 9);
        if (cb->headers) {
            if (!PyTuple_Check(headers)) {
                PyErr_SetString(PyExc_TypeError, "record headers are not a tuple");
                return -1;
            }
            for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers) && !plan->full; h++) {
                PyObject *pair = PyTuple_GET_ITEM(headers, h);
                const unsigned char *hvalue;
                Py_ssize_t hklen, hvlen;
                const char *hkey;
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    PyErr_SetString(PyExc_TypeError, "a record header is not a (key, value) pair");
                    return -1;
                }
                hkey = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &hklen);
                if (hkey == NULL || bytes_or_none(PyTuple_GET_ITEM(pair, 1), &hvalue, &hvlen) < 0) {
                    return -1;
                }
                int hr = put_header(cb, (const unsigned char *)hkey, hklen, hvalue, hvlen);
                if (hr == ERR_PYTHON) {
                    return -1;
                }
                plan->full = hr == ERR_FULL;
            }
            if (plan->full) {
                continue;
            }
        }
        if (put_record(cb, offset, ts, (int32_t)ts_type, key, klen, value, vlen) != OK) {
            return -1;
        }
        plan->stored++;
    }
    return 0;
}

/* What append() returns for a batch parsed without error: the number of records stored, or None
 * (and the builder rolled back to ``before``) when they did not fit. */
static PyObject *
append_result(ColumnBuilder *cb, const store_plan *plan, const colstate *before)
{
    if (plan->full) {
        cb->s = *before;
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(plan->stored);
}

/* The Python row decoder's records for the batch, stored; the builder is as before on error. */
static PyObject *
append_via_rows(ColumnBuilder *cb, PyObject *batch, store_plan *plan, int64_t base_offset)
{
    colstate before = cb->s;
    PyObject *rows = call_fallback(batch, cb->topic, cb->partition);
    if (rows == NULL) {
        return NULL;
    }
    int r = put_rows(cb, rows, plan, base_offset);
    Py_DECREF(rows);
    if (r < 0) {
        cb->s = before;
        return NULL;
    }
    return append_result(cb, plan, &before);
}

/* A two-argument method call (``nargs`` given) on a builder not finished yet. */
static int
builder_usable(ColumnBuilder *cb, Py_ssize_t nargs, const char *signature)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes exactly 2 arguments", signature);
        return -1;
    }
    if (cb->finished) {
        PyErr_SetString(PyExc_RuntimeError, "ColumnBuilder.finish() was called already");
        return -1;
    }
    return 0;
}

static PyObject *
builder_append_locked(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    if (builder_usable(cb, nargs, "append(batch, start)") < 0) {
        return NULL;
    }
    PyObject *batch = args[0];
    store_plan plan = {0, 0, 0};
    plan.start = PyLong_AsLongLong(args[1]);
    if (plan.start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    col_batch bi;
    int64_t magic, codec, ts_type;
    if (get_int64(batch, s_magic, &magic) < 0 || get_int64(batch, s_base_offset, &bi.base_offset) < 0) {
        return NULL;
    }
    if (magic != 2) {
        return append_via_rows(cb, batch, &plan, bi.base_offset);
    }
    int is_control = batch_is_control(batch);
    if (is_control < 0) {
        return NULL;
    }
    if (is_control) {
        return PyLong_FromLong(0);
    }
    if (get_int64(batch, s_compression, &codec) < 0 || get_int64(batch, s_record_count, &bi.count) < 0 ||
        get_int64(batch, s_base_timestamp, &bi.base_timestamp) < 0 ||
        get_int64(batch, s_timestamp_type, &ts_type) < 0) {
        return NULL;
    }
    bi.log_append_time = ts_type != 0;
    bi.timestamp_type = (int32_t)ts_type;
    bi.log_append_ts = 0;
    if (bi.log_append_time && get_int64(batch, s_max_timestamp, &bi.log_append_ts) < 0) {
        return NULL;
    }
    parser p;
    p.nkeys = 0;
    records_src src;
    int opened = open_records(batch, codec, cb->topic, cb->partition, &p, &src);
    if (opened != OPEN_OK) {
        close_records(&src);
        return opened == OPEN_NOT_BUFFER ? append_via_rows(cb, batch, &plan, bi.base_offset) : NULL;
    }
    colstate before = cb->s;
    store_plan initial = plan;
    int status = parse_columns(&p, cb, &bi, &plan, NULL);
    close_records(&src);
    if (status == OK) {
        return append_result(cb, &plan, &before);
    }
    cb->s = before;
    if (status == ERR_CORRUPT) {
        raise_corrupt(p.err, cb->topic, cb->partition, bi.base_offset);
    }
    else if (status == ERR_FALLBACK) {
        return append_via_rows(cb, batch, &initial, bi.base_offset);
    }
    return NULL;
}

static inline uint32_t
be_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int64_t
be_i64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)be_u32(p) << 32) | (uint64_t)be_u32(p + 4));
}

#define LOG_OVERHEAD 12
#define V2_CRC_START 21
#define ATTR_CODEC 0x07
#define ATTR_TIMESTAMP_TYPE 0x08
#define ATTR_TRANSACTIONAL 0x10
#define ATTR_CONTROL 0x20

/* scan_batches(data) -> (next_offset, complete, epochs): the compiled twin of
 * records.scan_batches_py, reading batch headers only (the background side learns the next fetch
 * offset and the leader epochs of a partition's records without decoding them). */
static PyObject *
scan_batches(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    int64_t last_epoch = -1;
    PyObject *next = NULL, *result = NULL;
    PyObject *epochs = PyList_New(0);
    if (epochs == NULL) {
        goto done;
    }
    next = PyLong_FromLong(-1);
    while (next != NULL && pos + 17 <= end) {
        const int32_t size = (int32_t)be_u32(d + pos + 8);
        if (size < 0 || size > end - pos - LOG_OVERHEAD) {
            break;
        }
        const int64_t first = be_i64(d + pos);
        int64_t last = first;
        int32_t delta = 0;
        if (d[pos + 16] >= 2 && pos + 27 <= end) {
            delta = (int32_t)be_u32(d + pos + 23);
            const int32_t epoch = (int32_t)be_u32(d + pos + 12); /* partitionLeaderEpoch */
            if (epoch != last_epoch) {
                PyObject *entry = Py_BuildValue("(Li)", (long long)first, (int)epoch);
                if (entry == NULL || PyList_Append(epochs, entry) < 0) {
                    Py_XDECREF(entry);
                    Py_CLEAR(next);
                    goto done;
                }
                Py_DECREF(entry);
                last_epoch = epoch;
            }
        }
        Py_DECREF(next);
        if (!add_overflows(first, (int64_t)delta, &last) && !add_overflows(last, 1, &last)) {
            next = PyLong_FromLongLong((long long)last);
        }
        else { /* beyond int64 (a corrupt header): the exact sum, as Python's ints give it */
            PyObject *a = PyLong_FromLongLong((long long)first), *b = PyLong_FromLong((long)delta + 1);
            next = a != NULL && b != NULL ? PyNumber_Add(a, b) : NULL;
            Py_XDECREF(a);
            Py_XDECREF(b);
        }
        pos += LOG_OVERHEAD + size;
    }
    if (next != NULL) {
        result = Py_BuildValue("(NnO)", next, pos, epochs);
        next = NULL;
    }
done:
    Py_XDECREF(next);
    Py_XDECREF(epochs);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(scan_batches_doc,
             "scan_batches(data) -> (next_offset, complete, epochs)\n\n"
             "The offset after the last complete batch of a record set (-1: none), the bytes of its\n"
             "complete batches and (base offset, leader epoch) where the epoch changes; batch headers\n"
             "only. The compiled twin of records.scan_batches_py.");

/* Size an empty block's buffers from its first batch, as ColumnReader._reserve does: ``count``
 * records in ``size`` bytes, ``left`` bytes of batches from it to the end of the record set, up
 * to ``limit`` records in the block, or this batch's ``count`` when more (whole batches). */
static int
reserve_block(ColumnBuilder *cb, int64_t count, Py_ssize_t size, Py_ssize_t left, Py_ssize_t limit)
{
    if (count > size / 7) { /* the claim is bounded by the batch's real size (7 bytes a record) */
        count = size / 7;
    }
    if (count <= 0) {
        return 0;
    }
    Py_ssize_t records = (Py_ssize_t)(((int64_t)left * count + size - 1) / size), data = left;
    if (limit < left / 7) { /* else the data bound below is at least ``left``; and no overflow */
        Py_ssize_t bound = (Py_ssize_t)(((int64_t)limit * size + count - 1) / count) + size;
        data = bound < left ? bound : left;
        Py_ssize_t most = limit > count ? limit : (Py_ssize_t)count; /* whole batches up to limit, or one */
        if (most < records) {
            records = most;
        }
    }
    if (records > cb->max_offset) {
        records = cb->max_offset;
    }
    return reserve_records(cb, records) < 0 || reserve_data(cb, data) < 0 ? -1 : 0;
}

/* walk(records, pos, start, limit, check_crcs, read_committed) -> int
 *
 * ColumnReader's walk over a record set for the common batches, in one call: from byte ``pos`` of
 * ``records``, batch after batch while the builder holds fewer than ``limit`` records and the
 * next batch's records (its header's count) fit beside them, or the builder is empty, it splits
 * off the next v2 batch, checks its CRC (``check_crcs``), skips it when it ends before offset
 * ``start`` or is a control batch, and stores the records of an uncompressed one at offset >=
 * ``start``, as append() would (sizing an empty builder's buffers from that batch first, as
 * ColumnReader._reserve does).  It returns the position of the first batch it left alone, for
 * the Python walk to take with iter_batches and append(): anything short of a whole v2 batch (a
 * truncated tail, another magic, a length or CRC that is wrong: iter_batches raises the error),
 * a compressed batch, one that does not fit beside what the builder holds or whose records fail
 * to parse (append() raises or falls back), and with ``read_committed`` every transactional or
 * control batch: the aborted-transaction filter decides those.  The filter skips no other batch,
 * and what it learns from one (the aborted transactions it reaches) it learns again, in the same
 * order, from the next batch it is shown, before deciding on that one. */
static PyObject *
builder_walk_locked(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "walk(records, pos, start, limit, check_crcs, read_committed) takes 6 arguments");
        return NULL;
    }
    if (cb->finished) {
        PyErr_SetString(PyExc_RuntimeError, "ColumnBuilder.finish() was called already");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), limit;
    int64_t start;
    int check, committed, overflow = 0;
    if ((pos == -1 && PyErr_Occurred()) ||
        ((start = PyLong_AsLongLongAndOverflow(args[2], &overflow)) == -1 && PyErr_Occurred()) ||
        ((limit = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) || (check = PyObject_IsTrue(args[4])) < 0 ||
        (committed = PyObject_IsTrue(args[5])) < 0) {
        return NULL;
    }
    if (overflow) { /* a start beyond 64 bits (after a corrupt batch's last offset): Python's ints decide */
        return PyLong_FromSsize_t(pos);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "walk: pos lies outside the record set");
        goto done;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    while (cb->s.n < limit && end - pos >= V2_HEADER_SIZE) {
        const unsigned char *h = buf + pos;
        int32_t length = (int32_t)be_u32(h + 8);
        if (h[16] != 2 || length < V2_HEADER_SIZE - LOG_OVERHEAD || length > end - pos - LOG_OVERHEAD) {
            break;
        }
        Py_ssize_t batch_end = pos + LOG_OVERHEAD + length;
        int attrs = (h[21] << 8) | h[22];
        int64_t base_offset = be_i64(h), last;
        if (add_overflows(base_offset, (int32_t)be_u32(h + 23), &last)) {
            break; /* only corrupt batches have it: Python's ints give the reference answer */
        }
        /* Left to the Python walk before its CRC is checked here: iter_batches checks it there. */
        if ((attrs & ATTR_CODEC) || (committed && (attrs & (ATTR_TRANSACTIONAL | ATTR_CONTROL)))) {
            break;
        }
        if (last < start || (attrs & ATTR_CONTROL)) {
            if (check && crc32c(h + V2_CRC_START, (size_t)(batch_end - pos - V2_CRC_START)) != be_u32(h + 17)) {
                break;
            }
            pos = batch_end;
            continue;
        }
        col_batch bi;
        bi.count = (int32_t)be_u32(h + 57);
        if (cb->s.n > 0 && (int64_t)cb->s.n + bi.count > (int64_t)limit) {
            break; /* it would take the block past ``limit``: the next block's first (ColumnReader.take) */
        }
        bi.base_offset = base_offset;
        bi.base_timestamp = be_i64(h + 27);
        bi.timestamp_type = (attrs & ATTR_TIMESTAMP_TYPE) >> 3;
        bi.log_append_time = bi.timestamp_type != 0;
        bi.log_append_ts = bi.log_append_time ? be_i64(h + 35) : 0;
        parser p;
        p.buf = buf;
        p.pos = pos + V2_HEADER_SIZE;
        p.end = batch_end;
        p.nkeys = 0;
        store_plan plan = {start, 0, 0};
        if (cb->s.n == 0 && reserve_block(cb, bi.count, batch_end - pos, end - pos, limit) < 0) {
            goto done;
        }
        colstate before = cb->s;
        crc_run crc = {0xFFFFFFFFu, pos + V2_CRC_START};
        int status = parse_columns(&p, cb, &bi, &plan, check ? &crc : NULL);
        if (status == OK && check &&
            ~crc_update(crc.c, buf + crc.at, (size_t)(batch_end - crc.at)) != be_u32(h + 17)) {
            status = ERR_CORRUPT; /* rolled back: iter_batches raises the CRC error */
        }
        if (status != OK || plan.full) {
            cb->s = before;
            if (status == ERR_PYTHON) {
                goto done;
            }
            break; /* append() takes it: raises, falls back or reports it does not fit */
        }
        pos = batch_end;
    }
    result = PyLong_FromSsize_t(pos);
done:
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
builder_reserve_locked(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    if (builder_usable(cb, nargs, "reserve(records, data)") < 0) {
        return NULL;
    }
    Py_ssize_t records = PyLong_AsSsize_t(args[0]), data;
    if ((records == -1 && PyErr_Occurred()) || ((data = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    if (records < 0 || data < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve(records, data): both must be >= 0");
        return NULL;
    }
    /* Records take at least 7 bytes each in a batch: no more than max_offset of them fit anywhere. */
    if (records > cb->max_offset) {
        records = cb->max_offset;
    }
    if (reserve_records(cb, records) < 0 || reserve_data(cb, data) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A buffer cut to ``len`` bytes, handed over (a new reference). */
static PyObject *
take_buffer(colbuf *b, Py_ssize_t len)
{
    PyObject *obj;
    if (!b->external) {
        if (PyByteArray_Resize(b->obj, len) < 0) {
            return NULL;
        }
        obj = b->obj;
    }
    else if (len <= b->cap / 4) {
        /* A column far shorter than its buffer (keys longer than the first one made it grow): a copy
         * of its own, so that it does not keep the large buffer from being used again. */
        obj = PyByteArray_FromStringAndSize(b->p, len);
        if (obj == NULL) {
            return NULL;
        }
        Py_DECREF(b->obj);
    }
    else if (len < b->cap) {
        obj = PySequence_GetSlice(b->obj, 0, len);
        if (obj == NULL) {
            return NULL;
        }
        Py_DECREF(b->obj);
    }
    else {
        obj = b->obj;
    }
    b->obj = NULL;
    b->p = NULL;
    b->cap = 0;
    return obj;
}

/* Clear the bits of a bitmap past its ``n`` bits (left over by rolled-back appends). */
static void
mask_tail(colbuf *b, Py_ssize_t n)
{
    if (n & 7) {
        b->p[n >> 3] &= (char)((1u << (n & 7)) - 1);
    }
}

static PyObject *
builder_finish_locked(ColumnBuilder *cb, PyObject *unused)
{
    if (cb->finished) {
        PyErr_SetString(PyExc_RuntimeError, "ColumnBuilder.finish() was called already");
        return NULL;
    }
    cb->finished = 1; /* whatever happens below, the buffers are no longer the builder's */
    colstate *s = &cb->s;
    Py_ssize_t n = s->n, nh = s->nh;
    mask_tail(&cb->b[B_KEY_VALID], n);
    mask_tail(&cb->b[B_VALUE_VALID], n);
    Py_ssize_t lens[NBUFS] = {
        [B_OFFSETS] = n * 8,
        [B_TIMESTAMPS] = n * 8,
        [B_TS_TYPES] = n * 4,
        [B_KEY_OFFSETS] = (n + 1) * 4,
        [B_KEY_DATA] = s->key_len,
        [B_KEY_VALID] = (n + 7) / 8,
        [B_VALUE_OFFSETS] = (n + 1) * 4,
        [B_VALUE_DATA] = s->value_len,
        [B_VALUE_VALID] = (n + 7) / 8,
        [B_HDR_OFFSETS] = (n + 1) * 4,
        [B_HKEY_OFFSETS] = (nh + 1) * 4,
        [B_HKEY_DATA] = s->hkey_len,
        [B_HVALUE_OFFSETS] = (nh + 1) * 4,
        [B_HVALUE_DATA] = s->hvalue_len,
        [B_HVALUE_VALID] = (nh + 7) / 8,
    };
    if (cb->headers) {
        mask_tail(&cb->b[B_HVALUE_VALID], nh);
    }
    PyObject *bufs[NBUFS] = {NULL};
    PyObject *result = NULL;
    for (int i = 0; i < NBUFS; i++) {
        if (i >= FIRST_HEADER_BUF && !cb->headers) {
            bufs[i] = Py_None;
            Py_INCREF(Py_None);
        }
        else if ((bufs[i] = take_buffer(&cb->b[i], lens[i])) == NULL) {
            goto done;
        }
    }
    /* The order of protocol/columnar.py's Columns fields. */
    result = Py_BuildValue("(nOOOOOOnOOOnOOOOOOnnnL)", n, bufs[B_OFFSETS], bufs[B_TIMESTAMPS], bufs[B_TS_TYPES],
                           bufs[B_KEY_OFFSETS], bufs[B_KEY_DATA], bufs[B_KEY_VALID], s->key_nulls,
                           bufs[B_VALUE_OFFSETS], bufs[B_VALUE_DATA], bufs[B_VALUE_VALID], s->value_nulls,
                           bufs[B_HDR_OFFSETS], bufs[B_HKEY_OFFSETS], bufs[B_HKEY_DATA], bufs[B_HVALUE_OFFSETS],
                           bufs[B_HVALUE_DATA], bufs[B_HVALUE_VALID], nh, s->hvalue_nulls, s->ts_beyond,
                           (long long)s->ts_beyond_ms);
done:
    for (int i = 0; i < NBUFS; i++) {
        Py_XDECREF(bufs[i]);
    }
    return result;
}

/* append/reserve/finish hold the builder: ``allocate`` (Python code) calling back into it, or
 * another thread while the GIL is let go there, would find its buffers half-replaced. */
static int
builder_enter(ColumnBuilder *cb)
{
    if (cb->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "ColumnBuilder is busy: called again (from allocate() or another thread) while storing");
        return -1;
    }
    cb->busy = 1;
    return 0;
}

/* The builder again, after a call builder_enter let in: ``result`` passed through. */
static PyObject *
builder_leave(ColumnBuilder *cb, PyObject *result)
{
    cb->busy = 0;
    return result;
}

static PyObject *
builder_append(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    return builder_enter(cb) < 0 ? NULL : builder_leave(cb, builder_append_locked(cb, args, nargs));
}

static PyObject *
builder_walk(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    return builder_enter(cb) < 0 ? NULL : builder_leave(cb, builder_walk_locked(cb, args, nargs));
}

static PyObject *
builder_reserve(ColumnBuilder *cb, PyObject *const *args, Py_ssize_t nargs)
{
    return builder_enter(cb) < 0 ? NULL : builder_leave(cb, builder_reserve_locked(cb, args, nargs));
}

static PyObject *
builder_finish(ColumnBuilder *cb, PyObject *unused)
{
    return builder_enter(cb) < 0 ? NULL : builder_leave(cb, builder_finish_locked(cb, unused));
}

static PyObject *
builder_count(ColumnBuilder *cb, void *closure)
{
    return PyLong_FromSsize_t(cb->s.n);
}

static void
builder_dealloc(ColumnBuilder *cb)
{
    for (int i = 0; i < NBUFS; i++) {
        Py_XDECREF(cb->b[i].obj);
    }
    Py_XDECREF(cb->topic);
    Py_XDECREF(cb->partition);
    Py_XDECREF(cb->allocate);
    Py_TYPE(cb)->tp_free((PyObject *)cb);
}

static PyObject *
builder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"topic", "partition", "headers", "max_offset", "allocate", "min_allocate", NULL};
    PyObject *topic, *partition, *allocate = Py_None;
    int headers = 1;
    Py_ssize_t max_offset = INT32_MAX, min_allocate = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO!|pnOn:ColumnBuilder", kwlist, &topic, &PyLong_Type,
                                     &partition, &headers, &max_offset, &allocate, &min_allocate)) {
        return NULL;
    }
    if (min_allocate < 0) {
        PyErr_SetString(PyExc_ValueError, "min_allocate must be >= 0");
        return NULL;
    }
    if (allocate != Py_None && !PyCallable_Check(allocate)) {
        PyErr_SetString(PyExc_TypeError, "allocate must be callable or None");
        return NULL;
    }
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncconsumer._speedups.bind() was not called");
        return NULL;
    }
    if (max_offset < 0 || max_offset > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "max_offset must lie in 0 .. 2**31 - 1 (Arrow's int32 offsets)");
        return NULL;
    }
    ColumnBuilder *cb = (ColumnBuilder *)type->tp_alloc(type, 0);
    if (cb == NULL) {
        return NULL;
    }
    Py_INCREF(topic);
    cb->topic = topic;
    Py_INCREF(partition);
    cb->partition = partition;
    cb->s.ts_beyond = -1;
    if (allocate != Py_None) {
        Py_INCREF(allocate);
        cb->allocate = allocate;
    }
    cb->headers = headers;
    cb->max_offset = max_offset;
    cb->key_reserve = 0;
    int nbufs = headers ? NBUFS : FIRST_HEADER_BUF;
    for (int i = 0; i < nbufs; i++) {
        if (colbuf_init(&cb->b[i], cb->allocate, min_allocate, 64) < 0) {
            Py_DECREF(cb);
            return NULL;
        }
    }
    /* offsets[0] of every offsets buffer */
    int starts[] = {B_KEY_OFFSETS, B_VALUE_OFFSETS, B_HDR_OFFSETS, B_HKEY_OFFSETS, B_HVALUE_OFFSETS};
    for (int i = 0; i < (int)(sizeof(starts) / sizeof(starts[0])); i++) {
        if (starts[i] < nbufs) {
            put_i32(&cb->b[starts[i]], 0, 0);
        }
    }
    return (PyObject *)cb;
}

PyDoc_STRVAR(builder_doc,
             "ColumnBuilder(topic, partition, headers=True, max_offset=2**31 - 1, allocate=None,\n"
             "              min_allocate=0)\n\n"
             "Record batches to Arrow-ready column buffers; see asyncconsumer.protocol.columnar.\n"
             "``allocate(size)`` gives the buffers of ``min_allocate`` bytes or more.");
PyDoc_STRVAR(append_doc,
             "append(batch, start) -> int | None\n\n"
             "Store the batch's records at offset >= start; how many, or None (nothing stored) when\n"
             "they do not fit under max_offset.  All or nothing: on error the builder is unchanged.");
PyDoc_STRVAR(reserve_doc,
             "reserve(records, data) -> None\n\n"
             "Capacity for ``records`` more records and ``data`` more bytes of keys and of values\n"
             "(each capped at max_offset), allocated now, exactly: a size hint, stores nothing.");
PyDoc_STRVAR(walk_doc,
             "walk(records, pos, start, limit, check_crcs, read_committed) -> int\n\n"
             "Store the records of the plain v2 batches of ``records`` from byte ``pos`` on, as append()\n"
             "would, until the builder holds ``limit`` records or a batch needs the Python walk; the\n"
             "position of the first batch not taken.  See protocol/columnar.py ColumnReader.");
PyDoc_STRVAR(finish_doc, "finish() -> tuple\n\nThe column buffers (protocol/columnar.py Columns order).");

static PyMethodDef builder_methods[] = {
    {"append", (PyCFunction)(void (*)(void))builder_append, METH_FASTCALL, append_doc},
    {"reserve", (PyCFunction)(void (*)(void))builder_reserve, METH_FASTCALL, reserve_doc},
    {"walk", (PyCFunction)(void (*)(void))builder_walk, METH_FASTCALL, walk_doc},
    {"finish", (PyCFunction)builder_finish, METH_NOARGS, finish_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef builder_getset[] = {
    {"count", (getter)builder_count, NULL, "records stored so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ColumnBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asyncconsumer._speedups.ColumnBuilder",
    .tp_basicsize = sizeof(ColumnBuilder),
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = builder_doc,
    .tp_methods = builder_methods,
    .tp_getset = builder_getset,
    .tp_new = builder_new,
};

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

static PyObject *
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
static PyObject *
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
static PyObject *
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

PyDoc_STRVAR(int32_steps_doc,
             "int32_steps(count, step) -> bytearray\n\n"
             "``count`` int32 values in native byte order: 0, step, 2 * step, ... (a string column's offsets\n"
             "for a value ``step`` bytes long in every row), as array('i', range(...)) gives them, 50 times faster.");

PyDoc_STRVAR(arrow_address_doc,
             "arrow_address(capsule) -> int\n\n"
             "The address of the ArrowArray an export_arrow capsule holds (not imported yet), for an\n"
             "importer that takes an address; the capsule must outlive the import.");

PyDoc_STRVAR(export_arrow_doc,
             "export_arrow(node) -> PyCapsule\n\n"
             "An Arrow C data interface array (a capsule named \"arrow_array\") over the buffers of a\n"
             "node (format, length, null_count, offset, buffers, children), without copying them:\n"
             "format is z, u, i, l, +l or +s (Arrow's format strings, for the layout checked against\n"
             "the buffers), buffers a tuple of buffer objects or None, children a tuple of nodes.\n"
             "The buffers are held until Arrow releases the array.");

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
    {"crc32c", (PyCFunction)crc32c_py, METH_O, crc32c_doc},
    {"crc32c_kernel", (PyCFunction)crc32c_kernel_py, METH_VARARGS, crc32c_kernel_doc},
    {"scan_batches", (PyCFunction)scan_batches, METH_O, scan_batches_doc},
    {"export_arrow", (PyCFunction)export_arrow, METH_O, export_arrow_doc},
    {"arrow_address", (PyCFunction)arrow_address, METH_O, arrow_address_doc},
    {"int32_steps", (PyCFunction)int32_steps, METH_VARARGS, int32_steps_doc},
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
    if (empty_tuple == NULL || str_prefix == NULL || PyType_Ready(&ColumnBuilderType) < 0) {
        return NULL;
    }
    crc_init();
    crc_detect();
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "HW_CRC32C", (crc_kernels >> CRC_STREAMS) & 1u) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    /* the CRC-32C kernels this machine has, best first */
    PyObject *kernels = PyList_New(0);
    for (int kernel = CRC_FOLD512; kernels != NULL && kernel >= CRC_TABLE; kernel--) {
        if (!(crc_kernels & (1u << kernel))) {
            continue;
        }
        PyObject *name = PyUnicode_FromString(crc_kernel_names[kernel]);
        if (name == NULL || PyList_Append(kernels, name) < 0) {
            Py_XDECREF(name);
            Py_CLEAR(kernels);
            break;
        }
        Py_DECREF(name);
    }
    Py_XSETREF(kernels, kernels == NULL ? NULL : PyList_AsTuple(kernels));
    if (kernels == NULL || PyModule_AddObject(module, "CRC32C_KERNELS", kernels) < 0) {
        Py_XDECREF(kernels);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&ColumnBuilderType);
    if (PyModule_AddObject(module, "ColumnBuilder", (PyObject *)&ColumnBuilderType) < 0) {
        Py_DECREF(&ColumnBuilderType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
