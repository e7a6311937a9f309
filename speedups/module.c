/*
 * The module table (speedups.h lists the extension's files): the objects bind() gives the decoders,
 * the names the extension reads on the package's objects, the module's functions with their
 * docstrings, and PyInit__speedups.
 */

#include "speedups.h"

PyTypeObject *record_type = NULL;
PyObject *corrupt_error = NULL;
PyObject *fallback = NULL;
PyObject *decompress_fn = NULL;

PyObject *empty_tuple = NULL;
PyObject *str_prefix = NULL;

PyObject *s_magic, *s_is_control, *s_compression, *s_buf, *s_start, *s_size_in_bytes, *s_record_count,
    *s_base_offset, *s_base_timestamp, *s_timestamp_type, *s_max_timestamp, *s_leader_epoch, *s_topic, *s_partition,
    *s_offset, *s_fields;
PyObject *s_chunks, *s_owner, *s_engine, *s_task, *s_closed, *s_epoch, *s_paused, *s_revoking, *s_consumed;

/* ------------------------------------------------------------------ the names the extension reads
 *
 * Every name the extension looks up on the package's objects, interned once, with where it is
 * looked up: "module:Class" for an attribute of Class (its instances' or its own), "module:Class()"
 * for a keyword argument of Class's constructor.  The module exports the table as PYTHON_NAMES;
 * tests/test_speedups.py reads it from this file and checks every entry against the class, so
 * that a rename in Python fails that test in every build, not only a read in builds with the
 * extension.  (ChunkBase's members, ready.c, are app/collector.py's CHUNK_FIELDS; the same test
 * checks them.)
 */

static const struct {
    PyObject **slot;
    const char *name;
    const char *owner;
} python_names[] = {
    /* a batch's header, as protocol/records.py parsed it (records.c, columns.c) */
    {&s_magic, "magic", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_is_control, "is_control", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_compression, "compression", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_buf, "_buf", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_start, "_start", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_size_in_bytes, "size_in_bytes", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_record_count, "record_count", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_base_offset, "base_offset", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_base_timestamp, "base_timestamp", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_timestamp_type, "timestamp_type", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_max_timestamp, "max_timestamp", "asyncconsumer.protocol.records:RecordBatch"},
    {&s_leader_epoch, "leader_epoch", "asyncconsumer.protocol.records:RecordBatch"},
    /* the error a corrupt batch raises (records.c) */
    {&s_topic, "topic", "asyncconsumer.errors:CorruptRecordError()"},
    {&s_partition, "partition", "asyncconsumer.errors:CorruptRecordError()"},
    {&s_offset, "offset", "asyncconsumer.errors:CorruptRecordError()"},
    /* the NamedTuple classes slot_fields() lays out (fields.c) */
    {&s_fields, "_fields", "asyncconsumer.structs:ConsumerRecord"},
    /* async for: RecordStream (ready.c) reads the collector's FastPath, the consumer's polling task,
     * its engine and the partitions' states, and writes a state's ``consumed`` */
    {&s_chunks, "chunks", "asyncconsumer.app.collector:FastPath"},
    {&s_owner, "owner", "asyncconsumer.app.collector:FastPath"},
    {&s_engine, "engine", "asyncconsumer.app.collector:FastPath"},
    {&s_task, "task", "asyncconsumer.app.client:PollOwner"},
    {&s_closed, "closed", "asyncconsumer.engine.loop:Engine"},
    {&s_epoch, "epoch", "asyncconsumer.managers.subscription:PartitionState"},
    {&s_paused, "paused", "asyncconsumer.managers.subscription:PartitionState"},
    {&s_revoking, "revoking", "asyncconsumer.managers.subscription:PartitionState"},
    {&s_consumed, "consumed", "asyncconsumer.managers.subscription:PartitionState"},
};

#define N_PYTHON_NAMES (sizeof(python_names) / sizeof(python_names[0]))

/* Intern every name of the table; PYTHON_NAMES, the table as ((owner, name), ...), or NULL. */
static PyObject *
intern_python_names(void)
{
    PyObject *table = PyTuple_New((Py_ssize_t)N_PYTHON_NAMES);
    if (table == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < N_PYTHON_NAMES; i++) {
        PyObject *name = PyUnicode_InternFromString(python_names[i].name);
        PyObject *entry = name == NULL ? NULL : Py_BuildValue("(sO)", python_names[i].owner, name);
        if (entry == NULL) {
            Py_XDECREF(name);
            Py_DECREF(table);
            return NULL;
        }
        *python_names[i].slot = name; /* the module keeps this reference for the process's life */
        PyTuple_SET_ITEM(table, (Py_ssize_t)i, entry);
    }
    return table;
}

/* ------------------------------------------------------------------ bind */

int
plain_tuple_subclass(PyTypeObject *t)
{
    return PyType_IsSubtype(t, &PyTuple_Type) && t->tp_basicsize == PyTuple_Type.tp_basicsize &&
           t->tp_itemsize == PyTuple_Type.tp_itemsize && t->tp_dictoffset == 0 && t->tp_weaklistoffset == 0;
}

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
    if (!plain_tuple_subclass(t) || t->tp_alloc == NULL) {
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

PyDoc_STRVAR(crc32c_kernel_doc,
             "crc32c_kernel(name, data, value=0) -> int\n\n"
             "CRC-32C of ``data`` by one kernel of CRC32C_KERNELS (\"fold512\", \"fold256\", \"streams\",\n"
             "\"table\"), continuing from the CRC-32C ``value`` of the bytes before it; for tests.");

PyDoc_STRVAR(crc32c_doc,
             "crc32c(data) -> int\n\n"
             "CRC-32C of a bytes-like object (the record batch checksum), as the column walk computes it.");

PyDoc_STRVAR(scan_batches_doc,
             "scan_batches(data) -> (next_offset, complete, epochs)\n\n"
             "The offset after the last complete batch of a record set (-1: none), the bytes of its\n"
             "complete batches and (base offset, leader epoch) where the epoch changes; batch headers\n"
             "only. The compiled twin of records.scan_batches_py.");

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
PyDoc_STRVAR(decode_next_doc,
             "decode_next(data, pos, position, check_crcs, topic, partition[, max_records]) -> (records, next_pos) | None\n\n"
             "A row read's walk over a record set from byte ``pos``: the records of the next plain v2 batch\n"
             "not before ``position`` (control batches passed over) and the byte after it; (None, pos) at\n"
             "the end; None: the batch at ``pos`` is for the Python walk (records.iter_batches).  With\n"
             "max_records > 0, whole plain batches after it too, until at least that many records.");
PyDoc_STRVAR(extend_records_doc,
             "extend_records(cls, records, start, stop, extra) -> list\n\n"
             "For each tuple of records[start:stop], a cls (a tuple subclass adding no fields) holding its\n"
             "items and then extra's: ``tuple.__new__(cls, record + extra)`` with one allocation.");
PyDoc_STRVAR(bind_doc,
             "bind(record_type, corrupt_error, fallback, decompress) -> None\n\n"
             "Give the decoder the record type, the error class, the Python decoder (for legacy\n"
             "message sets and values beyond 64 bits) and the decompression function.");

PyDoc_STRVAR(ready_doc,
             "ready(value) -> Ready\n\n"
             "An awaitable that is already complete: ``await ready(x)`` is ``x``, with no coroutine and\n"
             "no suspension (app/iterators.py has its pure-Python twin).");

PyDoc_STRVAR(slot_fields_doc,
             "slot_fields(cls) -> None\n\n"
             "Replace a NamedTuple class's field getters by member descriptors at the tuple items'\n"
             "offsets: the same values, read by the interpreter without a call (fields.c).");

PyDoc_STRVAR(decode_message_doc,
             "decode_message(programs, view) -> list[dict] | None\n\n"
             "Parse one message struct after another from a frame's memoryview, each by its program\n"
             "(protocol/messages.py MessageStruct.program()): the compiled twin of MessageStruct._parse.\n"
             "None when the frame does not read as those structs: the Python decoder then says why.");

PyDoc_STRVAR(encode_message_doc,
             "encode_message(programs, bodies, prefix) -> bytes | None\n\n"
             "A frame: its int32 size, ``prefix`` (a request header), then each body by its program\n"
             "(protocol/messages.py MessageStruct.program()): the compiled twin of MessageStruct._build\n"
             "for plain bodies.  None for any other: the Python encoder then writes it or says why not.");

static PyMethodDef methods[] = {
    {"decode_batch", (PyCFunction)(void (*)(void))decode_batch, METH_FASTCALL, decode_batch_doc},
    {"bind", (PyCFunction)bind, METH_VARARGS, bind_doc},
    {"crc32c", (PyCFunction)crc32c_py, METH_O, crc32c_doc},
    {"crc32c_kernel", (PyCFunction)crc32c_kernel_py, METH_VARARGS, crc32c_kernel_doc},
    {"scan_batches", (PyCFunction)scan_batches, METH_O, scan_batches_doc},
    {"decode_next", (PyCFunction)(void (*)(void))decode_next, METH_FASTCALL, decode_next_doc},
    {"extend_records", (PyCFunction)(void (*)(void))extend_records, METH_FASTCALL, extend_records_doc},
    {"export_arrow", (PyCFunction)export_arrow, METH_O, export_arrow_doc},
    {"arrow_address", (PyCFunction)arrow_address, METH_O, arrow_address_doc},
    {"int32_steps", (PyCFunction)int32_steps, METH_VARARGS, int32_steps_doc},
    {"ready", (PyCFunction)ready, METH_O, ready_doc},
    {"slot_fields", (PyCFunction)slot_fields, METH_O, slot_fields_doc},
    {"decode_message", (PyCFunction)(void (*)(void))decode_message, METH_FASTCALL, decode_message_doc},
    {"encode_message", (PyCFunction)(void (*)(void))encode_message, METH_FASTCALL, encode_message_doc},
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

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *names = intern_python_names();
    if (names == NULL) {
        return NULL;
    }
    empty_tuple = PyTuple_New(0);
    str_prefix = PyUnicode_FromString("record batch is corrupt: ");
    if (empty_tuple == NULL || str_prefix == NULL || PyType_Ready(&ColumnBuilderType) < 0 ||
        PyType_Ready(&ReadyType) < 0 || PyType_Ready(&RecordStreamType) < 0 ||
        PyType_Ready(&ChunkBaseType) < 0) {
        Py_DECREF(names);
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL || PyModule_AddObject(module, "PYTHON_NAMES", names) < 0) {
        Py_XDECREF(module);
        Py_DECREF(names);
        return NULL;
    }
    if (crc_setup(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    PyTypeObject *types[] = {&ColumnBuilderType, &RecordStreamType, &ChunkBaseType};
    const char *type_names[] = {"ColumnBuilder", "RecordStream", "ChunkBase"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(module, type_names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
