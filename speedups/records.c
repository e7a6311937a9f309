/*
 * Record decoding (speedups.h lists the extension's files).
 *
 *     decode_batch(batch, topic, partition) -> list[ConsumerRecord]
 *
 * with exactly the contract of the pure-Python ``decode_batch_py`` in
 * asyncconsumer/protocol/records.py (which stays the reference and the
 * automatic fallback).  It parses the records section of a v2 record batch
 * (magic 2): zigzag varints, keys, values, headers, timestamp and offset
 * deltas (the helpers in speedups.h); it builds each ConsumerRecord directly
 * as an instance of the NamedTuple (a tuple subclass without extra fields),
 * so no Python code runs per record.
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
 * bounds-checked against the end of the batch.  The column builder
 * (columns.c) opens a batch's records and reports its errors with the
 * per-batch functions here.
 *
 *     scan_batches(data) -> (next_offset, complete, epochs)
 *
 * reads batch headers only, for the background loop.
 *
 *     decode_next(data, pos, position, check_crcs, topic, partition[, max_records]) -> (records, next_pos) | None
 *
 * is a row read's walk over a fetched record set (``CompletedFetch``, read_uncommitted) a batch
 * at a time, or as many plain batches as ``max_records`` takes, without a RecordBatch object: the
 * batch headers read here, the CRC checked, control batches and batches before ``position`` passed
 * over, the plain batches decoded.  None hands the batch at ``pos`` to the Python walk
 * (``iter_batches``), which reads what is not plain (compressed, legacy, a length or CRC that is
 * wrong, which it then reports).
 */

#include "speedups.h"

/* ------------------------------------------------------------------ parsing records into tuples */


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

int
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

PyObject *
call_fallback(PyObject *batch, PyObject *topic, PyObject *partition)
{
    return PyObject_CallFunctionObjArgs(fallback, batch, topic, partition, NULL);
}

/* Raise CorruptRecordError("record batch is corrupt: " + detail, topic=, partition=, offset=). */
void
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

void
raise_corrupt(const char *detail, PyObject *topic, PyObject *partition, int64_t base_offset)
{
    PyObject *text = PyUnicode_FromString(detail);
    if (text != NULL) {
        raise_corrupt_obj(text, topic, partition, base_offset);
        Py_DECREF(text);
    }
}

int
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

void
close_records(records_src *src)
{
    if (src->have_view) {
        PyBuffer_Release(&src->view);
        src->have_view = 0;
    }
    Py_CLEAR(src->data);
}

/* The batch's ``is_control`` as 0/1, or -1 with an exception set. */
int
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

PyObject *
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

/* scan_batches(data) -> (next_offset, complete, epochs): the compiled twin of
 * records.scan_batches_py, reading batch headers only (the background side learns the next fetch
 * offset and the leader epochs of a partition's records without decoding them). */
PyObject *
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

/* decode_next(data, pos, position, check_crcs, topic, partition[, max_records]) -> (records, next_pos) | None:
 * from byte ``pos`` of the record set ``data``, the records of the next uncompressed v2 batch that
 * is not a control batch and does not end before ``position`` (all of its records: the caller drops
 * those before ``position``), and the byte after that batch; ``(None, pos)`` at the end of the data
 * (a truncated trailing batch included, as ``iter_batches`` stops there).  None: the batch at
 * ``pos`` (where the walk got to) is one for the Python walk, as described above.
 *
 * With ``max_records`` > 0 the walk goes on over the plain batches after that one (whole batches)
 * until it holds at least that many records, and returns them all with the byte it stopped at: the
 * end, or a batch for the Python walk, which the next call then answers None for.  Records written
 * a batch each (a slow producer's) then cost one call a take, not one a record. */
PyObject *
decode_next(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_next(data, pos, position, check_crcs, topic, partition[, max_records]) takes 6 or 7 "
                        "arguments");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "asyncconsumer._speedups.bind() was not called");
        return NULL;
    }
    PyObject *topic = args[4], *partition = args[5];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long long position = PyLong_AsLongLong(args[2]);
    int check_crcs = PyObject_IsTrue(args[3]);
    Py_ssize_t max_records = nargs == 7 ? PyLong_AsSsize_t(args[6]) : 0;
    if ((pos == -1 || position == -1 || check_crcs < 0 || max_records == -1) && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)view.buf;
    const Py_ssize_t n = view.len;
    PyObject *result = NULL;
    PyObject *gathered = NULL; /* the records of the batches before ``pos`` (``max_records`` > 0) */
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "decode_next: pos must not be negative");
        goto done;
    }
    for (;;) {
        if (n - pos <= 16) { /* no magic byte: the end */
            goto end;
        }
        if (d[pos + 16] != 2 || n - pos < V2_HEADER_SIZE) {
            goto python; /* legacy, or too short for a v2 header: the Python walk decides */
        }
        const int32_t length = (int32_t)be_u32(d + pos + 8);
        if (length < V2_HEADER_SIZE - LOG_OVERHEAD) {
            goto python; /* corrupt: the Python walk says so */
        }
        const Py_ssize_t batch_end = pos + LOG_OVERHEAD + (Py_ssize_t)length;
        if (batch_end > n) { /* a truncated trailing batch: the next fetch starts here */
            goto end;
        }
        const int attrs = (int)(((unsigned)d[pos + 21] << 8) | d[pos + 22]);
        const int64_t base_offset = be_i64(d + pos);
        const int32_t last_delta = (int32_t)be_u32(d + pos + 23);
        int64_t last_offset;
        if (add_overflows(base_offset, (int64_t)last_delta, &last_offset)) {
            goto python;
        }
        const int skip = (attrs & 0x20) || last_offset < position; /* a control batch, or all before */
        if (gathered != NULL && !skip && base_offset < position) {
            goto end; /* records before the position past the first batch: the caller drops only the first's */
        }
        if (!skip && (attrs & 0x07) != CODEC_NONE) {
            goto python; /* compressed: the Python walk's batch checks the CRC and decompresses it */
        }
        /* (the attributes and offsets above are read before the CRC is checked: with a wrong CRC the
         * batch goes to the Python walk, which raises, whatever they said) */
        if (check_crcs && crc32c(d + pos + 21, (size_t)(batch_end - pos - 21)) != be_u32(d + pos + 17)) {
            goto python; /* the Python walk raises the mismatch */
        }
        if (skip) {
            pos = batch_end;
            continue;
        }
        const int32_t epoch = (int32_t)be_u32(d + pos + 12);
        batch_info bi;
        parser p;
        p.nkeys = 0;
        p.buf = d;
        p.pos = pos + V2_HEADER_SIZE;
        p.end = batch_end;
        bi.count = (int32_t)be_u32(d + pos + 57);
        bi.base_offset = base_offset;
        bi.base_timestamp = be_i64(d + pos + 27);
        bi.log_append_time = (attrs & 0x08) != 0;
        bi.topic = topic;
        bi.partition = partition;
        PyObject *ts_type = PyLong_FromLong(bi.log_append_time ? 1 : 0);
        PyObject *epoch_obj = epoch >= 0 ? PyLong_FromLong((long)epoch) : Py_NewRef(Py_None);
        PyObject *log_ts = bi.log_append_time ? PyLong_FromLongLong((long long)be_i64(d + pos + 35)) : NULL;
        PyObject *records = NULL;
        int status = ERR_PYTHON;
        if (ts_type != NULL && epoch_obj != NULL && (log_ts != NULL || !bi.log_append_time)) {
            bi.timestamp_type = ts_type;
            bi.leader_epoch = epoch_obj;
            bi.log_append_ts = log_ts;
            status = OK;
            records = parse_records(&p, &bi, &status);
        }
        for (int i = 0; i < p.nkeys; i++) {
            Py_DECREF(p.key_str[i]);
        }
        Py_XDECREF(ts_type);
        Py_XDECREF(epoch_obj);
        Py_XDECREF(log_ts);
        if (records == NULL) {
            if (status == ERR_CORRUPT || status == ERR_FALLBACK) {
                goto python; /* the Python walk decodes it, and reports what is wrong */
            }
            goto done;
        }
        pos = batch_end;
        if (gathered == NULL) {
            gathered = records;
        }
        else {
            const Py_ssize_t at = PyList_GET_SIZE(gathered);
            const int failed = PyList_SetSlice(gathered, at, at, records);
            Py_DECREF(records);
            if (failed < 0) {
                goto done;
            }
        }
        if (PyList_GET_SIZE(gathered) >= max_records) {
            goto end;
        }
    }
python:
    if (gathered == NULL) {
        result = Py_NewRef(Py_None);
        goto done;
    }
end: /* the records gathered (None: none) and the byte the walk stopped at */
    result = Py_BuildValue("(On)", gathered != NULL ? gathered : Py_None, pos);
done:
    Py_XDECREF(gathered);
    PyBuffer_Release(&view);
    return result;
}

/* extend_records(cls, records, start, stop, extra) -> list: for each record of ``records[start:stop]``
 * (tuples), a ``cls`` (a tuple subclass adding nothing to tuple's layout) holding its items and then
 * ``extra``'s: the share consumer's records made from the decoder's with their delivery count and
 * lock deadline, one allocation each (``tuple.__new__(cls, record + extra)`` makes two). */
PyObject *
extend_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "extend_records(cls, records, start, stop, extra) takes exactly 5 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !plain_tuple_subclass((PyTypeObject *)args[0])) {
        PyErr_SetString(PyExc_TypeError, "extend_records: cls must be a tuple subclass without extra fields");
        return NULL;
    }
    if (!PyList_Check(args[1]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "extend_records: records must be a list and extra a tuple");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *records = args[1], *extra = args[4];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), stop = PyLong_AsSsize_t(args[3]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) {
        return NULL;
    }
    const Py_ssize_t n = PyList_GET_SIZE(records);
    start = start < 0 ? 0 : (start > n ? n : start);
    stop = stop < start ? start : (stop > n ? n : stop);
    const Py_ssize_t m = PyTuple_GET_SIZE(extra);
    PyObject *out = PyList_New(stop - start);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record)) {
            PyErr_SetString(PyExc_TypeError, "extend_records: every record must be a tuple");
            Py_DECREF(out);
            return NULL;
        }
        const Py_ssize_t k = PyTuple_GET_SIZE(record);
        PyObject *made = cls->tp_alloc(cls, k + m);
        if (made == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < k; j++) {
            PyTuple_SET_ITEM(made, j, Py_NewRef(PyTuple_GET_ITEM(record, j)));
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyTuple_SET_ITEM(made, k + j, Py_NewRef(PyTuple_GET_ITEM(extra, j)));
        }
        PyList_SET_ITEM(out, i - start, made);
    }
    return out;
}
