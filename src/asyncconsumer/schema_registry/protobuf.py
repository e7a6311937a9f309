"""Protobuf records in the schema registry wire format: the header, the message-index array, then
the message.

With ``message_type`` (a generated class, ``order_pb2.Order``), each payload is parsed into that
class, as confluent-kafka's ``ProtobufDeserializer`` does; the registry is asked once per schema id
only to know the id exists.

Without it, each schema id's file is built at run time into a ``DescriptorPool`` of its own, with
the files it imports, and the message-index array picks the message (``[0]`` the first top-level
message, ``[1, 0]`` the first message nested in the second ...), decoded into a dynamic message
class (``google.protobuf.message_factory.GetMessageClass``).  The schemas come from:

- the registry, asked with ``format=serialized``: Confluent's registry (and any registry storing
  what confluent-kafka's Python serializer registers) answers a base64 ``FileDescriptorProto``,
  read as it is;
- a registry answering ``.proto`` text instead (Apicurio, or a schema registered as text) is
  compiled by protoc, the one in ``grpcio-tools`` (a Python package, no protoc install), in this
  process, with the already-built imports handed to it as descriptors;
- an import the registry gives no reference for (the well-known ``google/protobuf/*.proto``,
  ``google/type/*.proto`` of googleapis-common-protos, or a file of a generated module you
  imported) is taken from protobuf's default descriptor pool, importing ``a/b/c.proto``'s module
  ``a.b.c_pb2`` if it can.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread

from ._base import HEADER_SIZE, RegistryDeserializer, SchemaCompileError, read_message_indexes
from .client import RegisteredSchema, SchemaRegistryClient
from .errors import ContextLike, SerializationError

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError, Message
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError("ProtobufDeserializer needs protobuf: pip install 'asyncconsumer[protobuf]'") from None

__all__ = ["ProtobufDeserializer"]

_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
#: Where the default pool's files of a prefix come from when no module of the plain name exists.
_MODULE_PREFIXES = {"confluent/": "confluent_kafka.schema_registry."}


class _Compiled:
    """One schema id: a fixed message class, or a file whose messages are picked by index."""

    __slots__ = ("classes", "file", "fixed", "pool")

    def __init__(
        self,
        fixed: type[Message] | None = None,
        pool: descriptor_pool.DescriptorPool | None = None,
        file: descriptor_pb2.FileDescriptorProto | None = None,
    ) -> None:
        self.fixed = fixed
        self.pool = pool
        self.file = file
        self.classes: dict[tuple[int, ...], type[Message]] = {}

    def message_class(self, indexes: tuple[int, ...], context: ContextLike | None, schema_id: int) -> type[Message]:
        if self.fixed is not None:
            return self.fixed
        cls = self.classes.get(indexes)
        if cls is None:
            assert self.pool is not None and self.file is not None
            names: list[str] = []
            where: Sequence[descriptor_pb2.DescriptorProto] = self.file.message_type
            for index in indexes:
                if index >= len(where):
                    raise SerializationError(
                        f"message index {list(indexes)} is out of range of schema id {schema_id} "
                        f"(at {'.'.join(names) or 'the file'}: {len(where)} message(s))", context, schema_id,
                    )
                names.append(where[index].name)
                where = where[index].nested_type
            full = ".".join([self.file.package, *names] if self.file.package else names)
            cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full))
            self.classes[indexes] = cls
        return cls


class ProtobufDeserializer(RegistryDeserializer[_Compiled, Message]):
    """Decodes Protobuf in the schema registry wire format into messages.

    ``client``
        The :class:`SchemaRegistryClient` to fetch writer schemas from.
    ``message_type``
        Your generated message class (``order_pb2.Order``): every record becomes one of it, as
        with confluent-kafka's ``ProtobufDeserializer``.  Default: a dynamic message of the type
        the record's schema and message index name (fields read as on a generated class;
        ``google.protobuf.json_format.MessageToDict`` turns it into a dict).
    """

    _format = "serialized"

    def __init__(self, client: SchemaRegistryClient, message_type: type[Message] | None = None) -> None:
        super().__init__(client)
        if message_type is not None and not (isinstance(message_type, type) and issubclass(message_type, Message)):
            raise TypeError(f"message_type: expected a generated protobuf message class, got {message_type!r}")
        self.message_type = message_type

    async def _compile(self, registered: RegisteredSchema, schema_id: int) -> _Compiled:
        if registered.schema_type != "PROTOBUF":
            raise SchemaCompileError(f"is a {registered.schema_type} schema, not Protobuf")
        if self.message_type is not None:
            return _Compiled(fixed=self.message_type)
        files: list[tuple[str, RegisteredSchema]] = []
        await self._references(registered, lambda name, schema: files.append((name, schema)))
        files.append(("", registered))
        return await anyio.to_thread.run_sync(_build, files, schema_id)

    def _decode(self, compiled: _Compiled, data: bytes, context: ContextLike | None, schema_id: int) -> Message:
        if compiled.fixed is not None and len(data) > HEADER_SIZE and data[HEADER_SIZE] == 0:
            start = HEADER_SIZE + 1  # the one-byte [0], what nearly every record has
            cls = compiled.fixed
        else:
            indexes, start = read_message_indexes(data, context, schema_id)
            cls = compiled.message_class(indexes, context, schema_id)
        message = cls()
        try:
            message.ParseFromString(memoryview(data)[start:])
        except DecodeError as exc:
            raise SerializationError(
                f"the payload is not a valid {cls.DESCRIPTOR.full_name} (schema id {schema_id}): {exc}", context,
                schema_id,
            ) from exc
        return message


# -- building a schema's files -------------------------------------------------------------------------


def _build(files: list[tuple[str, RegisteredSchema]], schema_id: int) -> _Compiled:
    """A pool with every file of ``files`` (imports first, the schema itself last, named "")."""
    pool = descriptor_pool.DescriptorPool()
    added: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    root: descriptor_pb2.FileDescriptorProto | None = None
    for name, schema in files:
        proto = _from_base64(schema.schema)
        if proto is None:
            for wanted in _IMPORT.findall(schema.schema):
                _add_known(pool, added, wanted)
            proto = _compile_text(name or f"schema-{schema_id}.proto", schema.schema, list(added.values()))
        if name:
            proto.name = name  # the name the referring file imports it by
        elif proto.name in added or not proto.name:
            proto.name = f"schema-{schema_id}.proto"
        for dependency in proto.dependency:
            _add_known(pool, added, dependency)
        pool.Add(proto)
        added[proto.name] = proto
        root = proto
    assert root is not None
    return _Compiled(pool=pool, file=root)


def _from_base64(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The ``FileDescriptorProto`` a base64 schema holds, or None if the text is not one."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return proto if raw else None


def _add_known(
    pool: descriptor_pool.DescriptorPool, added: dict[str, descriptor_pb2.FileDescriptorProto], name: str
) -> None:
    """``name`` (and its imports) from protobuf's default pool into ``pool``, unless there already."""
    if name in added:
        return
    known = _known_file(name)
    if known is None:
        return  # protoc or pool.Add names it as missing
    for dependency in known.dependency:
        _add_known(pool, added, dependency)
    pool.Add(known)
    added[name] = known


def _known_file(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    default = descriptor_pool.Default()
    try:
        found = default.FindFileByName(name)
    except KeyError:
        module = name.removesuffix(".proto").replace("/", ".").replace("-", "_") + "_pb2"
        candidates = [module] + [
            target + module for prefix, target in _MODULE_PREFIXES.items() if name.startswith(prefix)
        ]
        for candidate in candidates:
            try:
                importlib.import_module(candidate)
            except ImportError:
                continue
            break
        try:
            found = default.FindFileByName(name)
        except KeyError:
            return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def _compile_text(name: str, text: str, dependencies: list[descriptor_pb2.FileDescriptorProto]) -> Any:
    """``.proto`` text compiled by protoc (grpcio-tools) into a ``FileDescriptorProto``."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise SchemaCompileError(
            "is .proto text, which needs protoc to compile: pip install 'asyncconsumer[protobuf]' (grpcio-tools)"
        ) from None
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-proto-") as tmp:
        source = Path(tmp, "src", name)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text, encoding="utf-8")
        deps = Path(tmp, "deps.pb")
        deps.write_bytes(descriptor_pb2.FileDescriptorSet(file=dependencies).SerializeToString())
        out = Path(tmp, "out.pb")
        args = [f"--proto_path={Path(tmp, 'src')}", f"--descriptor_set_in={deps}", f"--descriptor_set_out={out}", name]
        if protoc.main(["protoc", *args]) != 0:
            # protoc printed why to the process's stderr; ask again for the text of it
            again = subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", *args], capture_output=True, text=True, timeout=120,
                check=False,
            )
            raise SchemaCompileError(f"does not compile: protoc says: {(again.stderr or again.stdout).strip()[:1000]}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return files[-1]
