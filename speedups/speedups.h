/*
 * The C extension ``asyncconsumer._speedups``: what its files share.
 *
 * One extension module (setup.py builds it from these files; without a C compiler the package
 * runs its pure-Python twins, which stay the reference):
 *
 *     records.c   record decoding: decode_batch (a v2 batch's records as ConsumerRecord tuples,
 *                 the twin of protocol/records.py decode_batch_py) and scan_batches (batch
 *                 headers only: the next fetch offset and the leader epochs)
 *     columns.c   the column builder: ColumnBuilder, record batches straight into Arrow-ready
 *                 column buffers (append, walk, reserve, finish; protocol/columnar.py drives it)
 *     arrow.c     the Arrow C data interface: export_arrow / arrow_address hand the buffers to
 *                 pyarrow without copying them; int32_steps
 *     crc32c.c    the CRC-32C kernels of the batch checksum: six streams of the CRC32
 *                 instruction, carry-less folding with VPCLMULQDQ, a table elsewhere
 *     ready.c     async for: ready(value), an awaitable already complete; ChunkBase, the fields of
 *                 a chunk of records; RecordStream, the common case of Consumer.__anext__ in C
 *     codec.c     decode_message / encode_message: protocol messages (headers, bodies) to dicts and
 *                 back, walking the programs protocol/messages.py compiles from the message
 *                 definitions (MessageStruct's twin)
 *     fields.c    slot_fields(cls): a NamedTuple's field getters as member descriptors, which the
 *                 interpreter reads without a call (ConsumerRecord, ShareConsumerRecord)
 *     module.c    the module table: bind(), the names the extension reads on Python objects
 *                 (PYTHON_NAMES), the Python-level functions and their docstrings, PyInit__speedups
 *
 * This header holds what more than one file uses: the objects bind() gives the decoders, the
 * interned names of module.c's table, the batch layout, and the per-record parsing helpers
 * (varints, a record's head and headers, the end checks) that both the row decoder (records.c)
 * and the column builder (columns.c) run for every record.  Those are ``static inline`` here, so
 * that each decoder's per-record loop is compiled in one piece with them: nothing on the
 * per-record path calls into another file.  What crosses files is per batch or rarer (opening a
 * batch's records, raising its error, the CRC of a 16 KiB chunk) and is declared below; it has
 * hidden visibility (INTERNAL), so the only symbol the shared object exports is its init function.
 */

#ifndef ASYNCCONSUMER_SPEEDUPS_H
#define ASYNCCONSUMER_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define V2_HEADER_SIZE 61
#define CODEC_NONE 0
#define RECORD_FIELDS 11
#define ERRBUF 200
#define KEY_CACHE 8

/* The v2 batch header (after the 12 bytes of base offset and length). */
#define LOG_OVERHEAD 12
#define V2_CRC_START 21
#define ATTR_CODEC 0x07
#define ATTR_TIMESTAMP_TYPE 0x08
#define ATTR_TRANSACTIONAL 0x10
#define ATTR_CONTROL 0x20

#if defined(__GNUC__) || defined(__clang__)
#define INTERNAL __attribute__((visibility("hidden")))
#else
#define INTERNAL
#endif

/* Bound by bind() (module.c). */
INTERNAL extern PyTypeObject *record_type; /* ConsumerRecord */
INTERNAL extern PyObject *corrupt_error;   /* CorruptRecordError */
INTERNAL extern PyObject *fallback;        /* decode_batch_py(batch, topic, partition) */
INTERNAL extern PyObject *decompress_fn;   /* _decompress(batch, codec, topic, partition) -> bytes */

INTERNAL extern PyObject *empty_tuple;
INTERNAL extern PyObject *str_prefix; /* "record batch is corrupt: " */

/* The names the extension reads on the package's objects, interned (module.c's table, PYTHON_NAMES,
 * says on which class each is read): of RecordBatch, CorruptRecordError's keywords, NamedTuple's
 * _fields ... */
INTERNAL extern PyObject *s_magic, *s_is_control, *s_compression, *s_buf, *s_start, *s_size_in_bytes,
    *s_record_count, *s_base_offset, *s_base_timestamp, *s_timestamp_type, *s_max_timestamp, *s_leader_epoch,
    *s_topic, *s_partition, *s_offset, *s_fields;
/* ... and, for RecordStream (ready.c), of the collector's FastPath, the consumer's PollOwner, its engine
 * and the partitions' states. */
INTERNAL extern PyObject *s_chunks, *s_owner, *s_engine, *s_task, *s_closed, *s_epoch, *s_paused, *s_revoking,
    *s_consumed;

/* ------------------------------------------------------------------ parsing, per record: the row decoder's
 * and the column builder's shared steps, inlined into each */

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

static inline int
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
static inline int
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

/* Big-endian fields of a batch header. */
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

/* -------------------------------------------------------- records.c: a batch's records, per batch */

INTERNAL int get_int64(PyObject *obj, PyObject *name, int64_t *out);
INTERNAL PyObject *call_fallback(PyObject *batch, PyObject *topic, PyObject *partition);
INTERNAL void raise_corrupt_obj(PyObject *detail, PyObject *topic, PyObject *partition, int64_t base_offset);
INTERNAL void raise_corrupt(const char *detail, PyObject *topic, PyObject *partition, int64_t base_offset);

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

INTERNAL int open_records(PyObject *batch, int64_t codec, PyObject *topic, PyObject *partition, parser *p,
                          records_src *src);
INTERNAL void close_records(records_src *src);
INTERNAL int batch_is_control(PyObject *batch);

/* -------------------------------------------------------- crc32c.c */

/* The CRC-32C state ``c`` (not inverted) carried over ``n`` more bytes, by the best kernel here. */
INTERNAL uint32_t crc_update(uint32_t c, const unsigned char *p, size_t n);
/* CRC-32C of ``n`` bytes. */
INTERNAL uint32_t crc32c(const unsigned char *p, size_t n);
/* The tables and this machine's kernels; adds HW_CRC32C and CRC32C_KERNELS to ``module``. */
INTERNAL int crc_setup(PyObject *module);

/* -------------------------------------------------------- columns.c */

INTERNAL extern PyTypeObject ColumnBuilderType;

/* -------------------------------------------------------- the module's functions (module.c's table) */

INTERNAL PyObject *decode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *scan_batches(PyObject *module, PyObject *arg);
INTERNAL PyObject *decode_next(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *extend_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *crc32c_py(PyObject *module, PyObject *arg);
INTERNAL PyObject *crc32c_kernel_py(PyObject *module, PyObject *args);
INTERNAL PyObject *export_arrow(PyObject *module, PyObject *node);
INTERNAL PyObject *arrow_address(PyObject *module, PyObject *capsule);
INTERNAL PyObject *int32_steps(PyObject *module, PyObject *args);
INTERNAL extern PyTypeObject ReadyType;
INTERNAL extern PyTypeObject RecordStreamType;
INTERNAL extern PyTypeObject ChunkBaseType;
INTERNAL PyObject *ready(PyObject *module, PyObject *value);
INTERNAL PyObject *slot_fields(PyObject *module, PyObject *arg);
INTERNAL PyObject *decode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *encode_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* 1: ``t`` subclasses tuple and adds nothing to its layout (a NamedTuple: __slots__ = ()); else 0. */
INTERNAL int plain_tuple_subclass(PyTypeObject *t);

#endif /* ASYNCCONSUMER_SPEEDUPS_H */
