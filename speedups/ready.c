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

#include <stddef.h>
#include <structmember.h>

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

/* ------------------------------------------------------------------ ChunkBase
 *
 * The fields of app/collector.py's Chunk (one partition's records taken for async for or
 * batches()), as a C struct, so that RecordStream reads and moves them without a lookup per
 * record; Chunk subclasses it (adding __init__ and ``live``) when the extension is in use.
 */

typedef struct {
    PyObject_HEAD
    PyObject *state;   /* the partition's PartitionState */
    PyObject *epoch;   /* state.epoch when taken */
    PyObject *records; /* list of records */
    Py_ssize_t index;  /* the next record to hand out */
    PyObject *end;     /* the position once the last record is handed out */
} ChunkBase;

static int
chunk_traverse(ChunkBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->state);
    Py_VISIT(self->epoch);
    Py_VISIT(self->records);
    Py_VISIT(self->end);
    return 0;
}

static int
chunk_clear(ChunkBase *self)
{
    Py_CLEAR(self->state);
    Py_CLEAR(self->epoch);
    Py_CLEAR(self->records);
    Py_CLEAR(self->end);
    return 0;
}

static void
chunk_dealloc(ChunkBase *self)
{
    PyObject_GC_UnTrack(self);
    chunk_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef chunk_members[] = {
    {"state", T_OBJECT_EX, offsetof(ChunkBase, state), 0, NULL},
    {"epoch", T_OBJECT_EX, offsetof(ChunkBase, epoch), 0, NULL},
    {"records", T_OBJECT_EX, offsetof(ChunkBase, records), 0, NULL},
    {"index", T_PYSSIZET, offsetof(ChunkBase, index), 0, NULL},
    {"end", T_OBJECT_EX, offsetof(ChunkBase, end), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ChunkBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncconsumer._speedups.ChunkBase",
    .tp_doc = "The fields of a chunk of records (app/collector.py's Chunk subclasses it).",
    .tp_basicsize = sizeof(ChunkBase),
    .tp_dealloc = (destructor)chunk_dealloc,
    .tp_traverse = (traverseproc)chunk_traverse,
    .tp_clear = (inquiry)chunk_clear,
    .tp_members = chunk_members,
    .tp_new = PyType_GenericNew,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
};

/* ------------------------------------------------------------------ RecordStream
 *
 * What ``async for record in consumer`` iterates when the consumer has no deserializers and the
 * default acquire()/release() (Consumer.__aiter__ decides): its am_anext is Consumer.__anext__'s
 * fast path in C, for the common case only: a record of the first chunk that is not its last,
 * the chunk live (its partition's epoch unchanged, not paused, not being revoked), no other poll
 * in progress, the engine running.  Then it moves the chunk's index and the partition's
 * ``consumed`` past the record, exactly as the Python fast path does, and returns ready(record).
 * Everything else (the last record of a chunk, no chunk, any check failing, any surprise in the
 * objects' types) is ``fallback()``, the consumer's bound ``__anext__``, which stays the reference.
 *
 * It reads what the collector's FastPath (app/collector.py) holds, and only that: ``chunks`` and
 * ``owner`` (the same objects for the collector's life, read once), ``owner.task`` and
 * ``engine.closed`` (per record).  Every name it reads is in module.c's table (PYTHON_NAMES).
 */

typedef struct {
    PyObject_HEAD
    PyObject *fast_path; /* the collector's FastPath: ``engine`` is read from it per record */
    PyObject *chunks;    /* fast_path.chunks, the collector's deque of chunks */
    PyObject *owner;     /* fast_path.owner, the consumer's PollOwner */
    PyObject *fallback;  /* the consumer's bound __anext__ */
    Ready *spare;        /* the last Ready handed out: used again once nobody else holds it */
} RecordStream;

static void
stream_dealloc(RecordStream *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->fast_path);
    Py_CLEAR(self->chunks);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->spare);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
stream_traverse(RecordStream *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast_path);
    Py_VISIT(self->chunks);
    Py_VISIT(self->owner);
    Py_VISIT(self->fallback);
    return 0;
}

/* The attributes the fast path reads for every record (``owner.task``, ``fast_path.engine``,
 * ``engine.closed``, the partition state's ``epoch``, ``paused``, ``revoking``) and the one it
 * writes (``state.consumed``), read straight from their slots where the class has them: a slot is
 * a member descriptor at a fixed offset in the object.  One cache per attribute holds the offset
 * found through the class's MRO and trusts it only for objects of exactly that class while the
 * class is unchanged (its version tag, which CPython clears when the class or a base is modified),
 * as the interpreter's own attribute caches do.  A class that looks attributes up its own way
 * (``__getattribute__``, ``__getattr__``, ``__setattr__``), or keeps the name elsewhere, takes
 * PyObject_GetAttr / PyObject_SetAttr: the same answer, slower. */

typedef struct {
    PyTypeObject *type;     /* the class the offset is for (a strong reference), or NULL */
    unsigned int version;   /* its version tag then */
    Py_ssize_t offset;
    PyTypeObject *unusable; /* the last class found without such a slot (compared, not held) */
    unsigned int unusable_version;
} SlotCache;

static SlotCache task_slot, engine_slot, closed_slot, epoch_slot, paused_slot, revoking_slot, consumed_slot;

/* ``type`` is ``seen``, not modified since its version tag was ``version``. */
static inline int
unchanged(PyTypeObject *type, PyTypeObject *seen, unsigned int version)
{
    return type == seen && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && type->tp_version_tag == version;
}

/* The offset of the writable object slot ``name`` of ``type``'s instances, 0 if it has none. */
static Py_NO_INLINE Py_ssize_t
find_slot(PyTypeObject *type, PyObject *name)
{
    if (type->tp_getattro != PyObject_GenericGetAttr || type->tp_setattro != PyObject_GenericSetAttr) {
        return 0;
    }
    /* borrowed; a lookup through the type assigns its version tag (read by the caller) */
    PyObject *descr = _PyType_Lookup(type, name);
    /* a member of this class's layout (a descriptor of another class could sit in the MRO) */
    if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type || !PyType_IsSubtype(type, PyDescr_TYPE(descr))) {
        return 0;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY) || member->offset <= 0 ||
        member->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
        return 0;
    }
    return member->offset;
}

/* Where ``obj``'s attribute ``name`` is: its slot's offset, or 0 (use the attribute). */
HOT Py_ssize_t
slot_offset(SlotCache *cache, PyObject *obj, PyObject *name)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (unchanged(type, cache->type, cache->version)) {
        return cache->offset;
    }
    if (unchanged(type, cache->unusable, cache->unusable_version)) {
        return 0;
    }
    Py_ssize_t offset = find_slot(type, name);
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        return 0; /* nothing to trust it by: this once through the attribute */
    }
    if (offset > 0) {
        Py_INCREF(type);
        Py_XSETREF(cache->type, type);
        cache->version = type->tp_version_tag;
        cache->offset = offset;
    }
    else {
        cache->unusable = type;
        cache->unusable_version = type->tp_version_tag;
    }
    return offset;
}

#define SLOT_AT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* ``obj.name`` (a new reference), or NULL with an error set. */
HOT PyObject *
get_attr(SlotCache *cache, PyObject *obj, PyObject *name)
{
    Py_ssize_t offset = slot_offset(cache, obj, name);
    if (offset > 0 && SLOT_AT(obj, offset) != NULL) {
        return Py_NewRef(SLOT_AT(obj, offset));
    }
    return PyObject_GetAttr(obj, name); /* an unset slot raises AttributeError there */
}

/* ``obj.name = value``, the reference to ``value`` stolen: 0, or -1 with an error set. */
HOT int
set_attr(SlotCache *cache, PyObject *obj, PyObject *name, PyObject *value)
{
    Py_ssize_t offset = slot_offset(cache, obj, name);
    if (offset > 0) {
        Py_XSETREF(SLOT_AT(obj, offset), value); /* the slot takes the reference */
        return 0;
    }
    int failed = PyObject_SetAttr(obj, name, value);
    Py_DECREF(value);
    return failed;
}

/* 1: ``obj.name`` is ``expected`` (identity); 0: it is not; -1: error. */
HOT int
attr_is(SlotCache *cache, PyObject *obj, PyObject *name, PyObject *expected)
{
    PyObject *value = get_attr(cache, obj, name);
    if (value == NULL) {
        return -1;
    }
    int same = value == expected;
    Py_DECREF(value);
    return same;
}

/* A record's offset (borrowed), or NULL (no error set) when ``record`` is not a tuple with an
 * exact int at index 2, as the decoder's records are. */
static PyObject *
record_offset(PyObject *record)
{
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(record, 2))) {
        return NULL;
    }
    return PyTuple_GET_ITEM(record, 2);
}

/* The record handed out by the fast path (a new reference), NULL to fall back (no error set), or
 * NULL with an error set. */
static PyObject *
fast_record(RecordStream *self)
{
    if (PyObject_Size(self->chunks) <= 0) {
        PyErr_Clear();
        return NULL;
    }
    int ok = attr_is(&task_slot, self->owner, s_task, Py_None);
    if (ok <= 0) {
        return NULL;
    }
    PyObject *engine = get_attr(&engine_slot, self->fast_path, s_engine);
    if (engine == NULL) {
        return NULL;
    }
    ok = engine != Py_None ? attr_is(&closed_slot, engine, s_closed, Py_False) : 0;
    Py_DECREF(engine);
    if (ok <= 0) {
        return NULL;
    }
    PyObject *first = PySequence_GetItem(self->chunks, 0);
    if (first == NULL) {
        return NULL;
    }
    /* a ChunkBase: app.collector.Chunk, which the last chunk's class (held) usually is */
    static PyTypeObject *chunk_type = NULL;
    if (Py_TYPE(first) != chunk_type) {
        if (!PyObject_TypeCheck(first, &ChunkBaseType)) {
            Py_DECREF(first);
            return NULL;
        }
        Py_XSETREF(chunk_type, (PyTypeObject *)Py_NewRef(Py_TYPE(first)));
    }
    ChunkBase *chunk = (ChunkBase *)first;
    PyObject *record = NULL, *state_epoch = NULL;
    PyObject *state = chunk->state, *records = chunk->records;
    if (state == NULL || chunk->epoch == NULL || records == NULL || !PyList_CheckExact(records)) {
        goto done;
    }
    if ((state_epoch = get_attr(&epoch_slot, state, s_epoch)) == NULL) {
        goto done;
    }
    ok = PyObject_RichCompareBool(state_epoch, chunk->epoch, Py_EQ);
    if (ok <= 0 || (ok = attr_is(&paused_slot, state, s_paused, Py_False)) <= 0 ||
        (ok = attr_is(&revoking_slot, state, s_revoking, Py_False)) <= 0) {
        goto done;
    }
    Py_ssize_t index = chunk->index;
    /* The last record of a chunk ends it: Consumer.__anext__ does that bookkeeping. */
    if (index < 0 || index + 1 >= PyList_GET_SIZE(records)) {
        goto done;
    }
    PyObject *candidate = PyList_GET_ITEM(records, index);
    PyObject *offset_obj = record_offset(candidate);
    if (offset_obj == NULL) {
        goto done;
    }
    long long offset = PyLong_AsLongLong(offset_obj);
    if (offset == -1 && PyErr_Occurred()) {
        goto done;
    }
    /* PartitionState.handed_out(record.offset + 1), as the Python fast path writes it; the index
     * moves only once that is done (an error leaves the record where it was).  That int is
     * usually the next record's offset (no gap): then that object, rather than a new one. */
    PyObject *consumed = NULL;
    PyObject *next = record_offset(PyList_GET_ITEM(records, index + 1));
    if (next != NULL) {
        long long next_offset = PyLong_AsLongLong(next);
        if (next_offset == offset + 1) {
            consumed = Py_NewRef(next);
        }
        else if (next_offset == -1 && PyErr_Occurred()) {
            goto done;
        }
    }
    if (consumed == NULL && (consumed = PyLong_FromLongLong(offset + 1)) == NULL) {
        goto done;
    }
    if (set_attr(&consumed_slot, state, s_consumed, consumed) < 0) {
        goto done;
    }
    chunk->index = index + 1;
    Py_INCREF(candidate);
    record = candidate;
done:
    Py_DECREF(first);
    Py_XDECREF(state_epoch);
    return record;
}

static PyObject *
stream_anext(PyObject *op)
{
    RecordStream *self = (RecordStream *)op;
    PyObject *record = fast_record(self);
    if (record != NULL) {
        /* The previous record's Ready again when only this stream still holds it (the loop has
         * awaited and dropped it, so nobody can tell): one allocation less per record. */
        Ready *ready_obj = self->spare;
        if (ready_obj != NULL && Py_REFCNT(ready_obj) == 1 && ready_obj->value == NULL) {
            ready_obj->value = record;
            return Py_NewRef((PyObject *)ready_obj);
        }
        ready_obj = PyObject_New(Ready, &ReadyType);
        if (ready_obj == NULL) {
            Py_DECREF(record);
            return NULL;
        }
        ready_obj->value = record;
        Py_XSETREF(self->spare, (Ready *)Py_NewRef((PyObject *)ready_obj));
        return (PyObject *)ready_obj;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyObject_CallNoArgs(self->fallback);
}

static PyObject *
stream_aiter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static PyObject *
stream_anext_method(PyObject *self, PyObject *unused)
{
    (void)unused;
    return stream_anext(self);
}

static PyMethodDef stream_methods[] = {
    {"__anext__", (PyCFunction)stream_anext_method, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods stream_async = {
    .am_aiter = stream_aiter,
    .am_anext = stream_anext,
};

static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);

PyTypeObject RecordStreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncconsumer._speedups.RecordStream",
    .tp_doc = "RecordStream(fast_path, fallback): async for over a consumer's records, the common\n"
              "case of Consumer.__anext__ in C (reading the collector's FastPath), anything else fallback().",
    .tp_basicsize = sizeof(RecordStream),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_traverse = (traverseproc)stream_traverse,
    .tp_as_async = &stream_async,
    .tp_methods = stream_methods,
    .tp_new = stream_new,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
};

static PyObject *
stream_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fast_path, *fallback;
    static char *names[] = {"fast_path", "fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:RecordStream", names, &fast_path, &fallback)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "RecordStream: fallback must be callable");
        return NULL;
    }
    PyObject *chunks = PyObject_GetAttr(fast_path, s_chunks);
    PyObject *owner = chunks == NULL ? NULL : PyObject_GetAttr(fast_path, s_owner);
    if (owner == NULL) {
        Py_XDECREF(chunks);
        return NULL;
    }
    RecordStream *self = (RecordStream *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(chunks);
        Py_DECREF(owner);
        return NULL;
    }
    self->fast_path = Py_NewRef(fast_path);
    self->chunks = chunks;
    self->owner = owner;
    self->fallback = Py_NewRef(fallback);
    return (PyObject *)self;
}
