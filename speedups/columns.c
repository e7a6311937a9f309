/*
 * The column builder (speedups.h lists the extension's files): record batches straight into
 * Arrow-ready column buffers, no Python object per record.  protocol/columnar.py drives it
 * (ColumnReader) and its pure-Python twin, PyColumnBuilder, stays the reference.
 */

#include "speedups.h"

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

PyTypeObject ColumnBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asyncconsumer._speedups.ColumnBuilder",
    .tp_basicsize = sizeof(ColumnBuilder),
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = builder_doc,
    .tp_methods = builder_methods,
    .tp_getset = builder_getset,
    .tp_new = builder_new,
};
