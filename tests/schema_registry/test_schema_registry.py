"""asyncconsumer.schema_registry on a real registry (Apicurio, the ``schema_registry`` fixture), on
asyncio and trio: what confluent-kafka 2.16's serializers write decodes to what confluent's own
deserializers return; one request per unknown schema id; a registry that is down or hangs gives a
typed error within the timeout, with no credential in it; wire-format errors name the record.

The deserializers are called directly here (``deserialize(data, context)``, awaited when it returns
an awaitable); tests/schema_registry/test_schema_registry_consume.py reads them from topics.
"""

from __future__ import annotations

import importlib
import inspect
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from google.protobuf import json_format
from support.registry_data import (
    CTX,
    CUSTOMER_READER,
    TEXT_COMMON_PROTO,
    TEXT_ORDER_PROTO,
    Context,
    Serdes,
    customer,
    decode,
    theirs,
)

from asyncconsumer.schema_registry import (
    AvroDeserializer,
    JSONSchemaDeserializer,
    ProtobufDeserializer,
    SchemaNotFoundError,
    SchemaRegistryClient,
    SchemaRegistryError,
    SchemaRegistryUnavailableError,
    SerializationError,
    UnknownSchemaError,
    WireFormatError,
)
from asyncconsumer.schema_registry.client import SingleFlight
from asyncconsumer.testing import SchemaRegistry

pytestmark = pytest.mark.anyio
#: The fixtures ``registry`` (the session's Apicurio) and ``serdes`` (confluent-kafka's serdes on it).
pytest_plugins = ["support.registry_fixtures"]


# -- agreement with confluent-kafka ---------------------------------------------------------------------


async def test_avro_agrees_with_confluent_references_unions_logical_types(serdes: Serdes) -> None:
    records = serdes.avro("sr-avro", 24)
    async with SchemaRegistryClient(serdes.url) as client:
        ours = AvroDeserializer(client)
        values = [await decode(ours, data) for data in records]
        expected = [theirs(serdes.avro_deserializer(), data, "sr-avro") for data in records]
        assert values == expected
        assert values[1] == customer(1)  # and both are what was written (a Decimal, an aware datetime, a UUID ...)
        # cached now: the value comes back directly, no awaitable
        assert ours.deserialize(records[5], CTX) == expected[5]

        named = AvroDeserializer(client, return_record_name=True)
        assert [await decode(named, data) for data in records] == [
            theirs(serdes.avro_deserializer(return_record_name=True), data, "sr-avro") for data in records
        ]
        assert (await decode(named, records[1]))["contact"] == ("sr.avro.Email", {"address": "c1@example.com"})


async def test_avro_reader_schema_resolves_each_writer_as_confluent_does(serdes: Serdes) -> None:
    records = serdes.avro("sr-avro-evolve", 6)
    async with SchemaRegistryClient(serdes.url) as client:
        ours = AvroDeserializer(client, reader_schema=json.dumps(CUSTOMER_READER))
        values = [await decode(ours, data) for data in records]
    assert values == [theirs(serdes.avro_deserializer(CUSTOMER_READER), data, "") for data in records]
    assert values[2]["home"] == {"street": "street 2", "zip": 1002, "country": "NL"} and values[2]["vip"] is False
    assert "balance" not in values[2]


async def test_protobuf_agrees_with_confluent_imports_nested_indexes(serdes: Serdes) -> None:
    records = serdes.protobuf("sr-proto", 12)
    pb = serdes.order_pb2
    async with SchemaRegistryClient(serdes.url) as client:
        typed = ProtobufDeserializer(client, pb.Order)
        dynamic = ProtobufDeserializer(client)
        for i, data in enumerate(records):
            note = i % 4 == 3
            expected = theirs(serdes.protobuf_deserializer(pb.Order.Line.Note if note else pb.Order), data, "")
            if not note:
                assert await decode(typed, data) == expected
            got = await decode(dynamic, data)
            assert got.DESCRIPTOR.full_name == ("sr.orders.Order.Line.Note" if note else "sr.orders.Order")
            assert json_format.MessageToDict(got) == json_format.MessageToDict(expected)
            assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
        assert data[5:8] == b"\x06\x00\x00"  # the last one is a Note: index array [0, 0, 0], not the short [0]


async def test_protobuf_schema_registered_as_proto_text_with_an_import(serdes: Serdes) -> None:
    """A registry answering .proto text (Apicurio does, for schemas registered as text): compiled at
    run time with the import the registry references, which no generated module in this process has."""
    common_id = serdes.register("srtext/common.proto", TEXT_COMMON_PROTO, "PROTOBUF")
    from confluent_kafka.schema_registry import SchemaReference

    version = serdes.client.get_latest_version("srtext/common.proto").version
    order_id = serdes.register(
        "sr-text-order-value", TEXT_ORDER_PROTO, "PROTOBUF",
        [SchemaReference("srtext/common.proto", "srtext/common.proto", version)],
    )
    assert common_id != order_id
    records = serdes.protobuf("sr-proto-text", 4)  # the same messages; their ids replaced by the text schema's
    async with SchemaRegistryClient(serdes.url) as client:
        dynamic = ProtobufDeserializer(client)
        for i, data in enumerate(records):
            relabelled = data[:1] + struct.pack(">I", order_id) + data[5:]
            got = await decode(dynamic, relabelled)
            assert got.DESCRIPTOR.full_name == ("srtext.orders.Order.Line.Note" if i == 3 else "srtext.orders.Order")
            expected = await decode(ProtobufDeserializer(client), data)
            assert json_format.MessageToDict(got) == json_format.MessageToDict(expected)


async def test_json_schema_agrees_with_confluent_and_validates(serdes: Serdes) -> None:
    records = serdes.json("sr-json", 10)
    async with SchemaRegistryClient(serdes.url) as client:
        ours = JSONSchemaDeserializer(client)
        assert [await decode(ours, data) for data in records] == [
            theirs(serdes.json_deserializer(), data, "sr-json") for data in records
        ]
        bad = records[3][:5] + b'{"id": "cart-x", "items": [{"sku": "a", "quantity": 0}]}'  # quantity < 1
        with pytest.raises(SerializationError, match=r"items/0/quantity.*(orders-3 at offset 42)") as caught:
            await decode(ours, bad)
        assert caught.value.schema_id == int.from_bytes(records[3][1:5], "big")
        with pytest.raises(Exception, match="less than the minimum"):  # confluent refuses it too
            theirs(serdes.json_deserializer(), bad, "sr-json")
        unchecked = JSONSchemaDeserializer(client, validate=False)
        assert (await decode(unchecked, bad))["items"][0]["quantity"] == 0


# -- the wire format and errors that name the record --------------------------------------------------


async def test_wire_format_errors_name_the_record(serdes: Serdes) -> None:
    proto = serdes.protobuf("sr-proto-wire", 1)[0]
    async with SchemaRegistryClient(serdes.url) as client:
        avro = AvroDeserializer(client)
        with pytest.raises(WireFormatError, match=r"^value: 3 byte\(s\) are too short.*\(orders-3 at offset 42\)$"):
            await decode(avro, b"\x00\x00\x01")
        with pytest.raises(WireFormatError, match=r"magic byte is 123.*\(orders-3 at offset 42\)"):
            await decode(avro, b'{"json": 1}')
        with pytest.raises(WireFormatError, match="message-index array ends") as caught:
            await decode(ProtobufDeserializer(client), proto[:5] + b"\x04\x80", Context("t", 0, 7, "key"))
        error = caught.value
        assert (error.topic, error.partition, error.offset, error.field) == ("t", 0, 7, "key")
        with pytest.raises(UnknownSchemaError, match=r"schema id 987654 is not in the registry.*404.*orders-3") as unk:
            await decode(avro, b"\x00" + struct.pack(">I", 987654) + b"\x02")
        assert isinstance(unk.value, SchemaRegistryError) and unk.value.status == 404 and unk.value.offset == 42
        with pytest.raises(SerializationError, match="is a PROTOBUF schema, not Avro"):
            await decode(avro, proto)
        with pytest.raises(SerializationError, match="does not decode with schema id"):
            await decode(avro, serdes.avro("sr-avro-short", 1)[0][:9])


async def test_registry_error_statuses_are_typed(registry: SchemaRegistry) -> None:
    async with SchemaRegistryClient(registry.url) as client:
        with pytest.raises(SchemaNotFoundError) as caught:
            await client.get_version("no-such-subject", 1)
    assert caught.value.status == 404 and caught.value.error_code is not None
    assert "/subjects/no-such-subject/versions/1" in caught.value.url


# -- one request per schema id ---------------------------------------------------------------------------


async def test_1000_records_of_50_unknown_ids_cost_at_most_50_requests(
    serdes: Serdes, registry: SchemaRegistry
) -> None:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    serializers = []
    for n in range(50):
        schema = {"type": "record", "name": f"Bulk{n}", "namespace": "sr.bulk",
                  "fields": [{"name": "n", "type": "int"}, {"name": "s", "type": "string"}]}
        serializers.append(AvroSerializer(serdes.client, json.dumps(schema)))
    records = [serializers[i % 50]({"n": i, "s": f"v{i}"}, serdes.ctx(f"sr-bulk-{anyio.get_current_task().id}"))
               for i in range(1000)]
    assert len({data[1:5] for data in records}) == 50
    values: list[Any] = [None] * len(records)
    async with SchemaRegistryClient(registry.url) as client:
        ours = AvroDeserializer(client)

        async def one(i: int) -> None:
            values[i] = await decode(ours, records[i], Context("bulk", 0, i))

        before = registry.request_count("/schemas/ids/{id}")
        async with anyio.create_task_group() as tg:
            for i in range(len(records)):
                tg.start_soon(one, i)
        sent = registry.request_count("/schemas/ids/{id}") - before
        assert 0 < sent <= 50, f"{sent} requests for 50 schema ids"
        assert values == [{"n": i, "s": f"v{i}"} for i in range(1000)]
        assert not any(inspect.isawaitable(ours.deserialize(data, CTX)) for data in records)  # all cached
        assert registry.request_count("/schemas/ids/{id}") - before == sent


async def test_a_cancelled_lookup_hands_over_to_a_waiter() -> None:
    """Three callers of one key: one call; when the caller running it is cancelled, a waiter calls
    again and every waiter gets that result."""
    flights: SingleFlight[str, int] = SingleFlight()
    calls = 0
    release = anyio.Event()

    async def call() -> int:
        nonlocal calls
        calls += 1
        number = calls
        await release.wait()
        return number

    results: list[int] = []
    leader = anyio.CancelScope()

    async def lead() -> None:
        with leader:
            await flights.run("k", call)

    async def wait() -> None:
        results.append(await flights.run("k", call))

    async with anyio.create_task_group() as tg:
        tg.start_soon(lead)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait)
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert calls == 1
        leader.cancel()
        await anyio.wait_all_tasks_blocked()
        assert calls == 2 and flights.in_flight("k")
        release.set()
    assert results == [2, 2] and not flights.in_flight("k")


# -- a registry that is down, or hangs ----------------------------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server that accepts connections and reads requests but never answers (a hung registry);
    yields its port and the requests it read."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    seen: list[bytes] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            conn.settimeout(1)
            try:
                seen.append(conn.recv(65536))
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_registry_that_is_down_raises_within_the_timeout() -> None:
    port = _closed_port()
    async with SchemaRegistryClient(f"http://127.0.0.1:{port}", timeout=1.0) as client:
        began = time.monotonic()
        with anyio.fail_after(15), pytest.raises(SchemaRegistryUnavailableError) as caught:
            await decode(AvroDeserializer(client), b"\x00\x00\x00\x00\x07\x02")
        elapsed = time.monotonic() - began
    assert 0.5 < elapsed < 6, elapsed  # retried until the timeout (1 s), not a hang
    message = str(caught.value)
    assert f"http://127.0.0.1:{port}/schemas/ids/7" in message and "no answer" in message
    assert "while deserializing the value of orders-3 at offset 42" in message
    assert caught.value.status is None and caught.value.retriable


async def test_a_hung_registry_raises_within_the_timeout_and_no_credential_is_shown(
    silent_server: tuple[int, list[bytes]],
) -> None:
    port, seen = silent_server
    tokens = iter(["tok-s3cret-1", "tok-s3cret-2"])
    clients = [
        SchemaRegistryClient(f"http://alice:pa55-s3cret@127.0.0.1:{port}", timeout=1.0),
        SchemaRegistryClient(f"http://127.0.0.1:{port}", basic_auth=("bob", "hunter2-s3cret"), timeout=1.0),
        SchemaRegistryClient(f"http://127.0.0.1:{port}", bearer_token_provider=lambda: next(tokens), timeout=1.0),
    ]
    for client in clients:
        began = time.monotonic()
        with anyio.fail_after(15), pytest.raises(SchemaRegistryUnavailableError) as caught:
            await client.get_schema(1)
        assert time.monotonic() - began < 6
        assert "gave up after the timeout of 1 s" in str(caught.value)
        await client.aclose()
        shown = f"{caught.value} {caught.value.url} {client!r} {caught.value!r}"
        assert "s3cret" not in shown and "hunter2" not in shown, shown
    requests = b"\n".join(seen).lower()
    assert b"authorization: basic " in requests and b"authorization: bearer tok-s3cret-1" in requests  # sent, not shown


# -- installs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "missing", "extra"), [
    ("avro", "fastavro", "avro"), ("protobuf", "google.protobuf", "protobuf"),
    ("json_schema", "jsonschema", "jsonschema"),
])
def test_a_missing_extra_names_the_pip_command(
    module: str, missing: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"asyncconsumer.schema_registry.{module}"
    for loaded in [m for m in sys.modules if m == missing or m.startswith(missing + ".") or m == name]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ImportError, match=rf"pip install 'asyncconsumer\[{extra}\]'"):
        importlib.import_module(name)


def test_the_documented_fixture_example(registry: SchemaRegistry) -> None:
    """docs/testing.md's example, as written there."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient

    client = ConfluentClient({"url": registry.url})
    schema_id = client.register_schema("greetings-value", Schema('"string"', "AVRO"))
    assert client.get_schema(schema_id).schema_str == '"string"'
