"""Avro decode speed: asyncconsumer.schema_registry's ``AvroDeserializer`` against confluent-kafka's,
side by side on the same records, in one run.

``python -m benchmarks.schema_registry [--records N] [--rounds R] [--registry-url URL]``

Starts the test registry (Apicurio, ``asyncconsumer.testing.SchemaRegistry``) unless
``--registry-url`` names one, writes N records with confluent-kafka's ``AvroSerializer`` (a
customer record: longs, strings, a nested record, a union, a map, decimal, timestamp-millis, uuid
and date logical types), then decodes all of them with each deserializer, schemas cached (one warm-up
pass each), R rounds alternating which goes first, best round of each.  Also with a reader schema
(schema resolution).  Both give the same values (checked).  Prints records/s and the ratio.

The machine is shared and noisy: compare by the ratio from one run, not across runs.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import gc
import inspect
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio

CUSTOMER = {
    "type": "record", "name": "BenchCustomer", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "city", "type": "string"}, {"name": "zip", "type": "int"},
        ]}},
        {"name": "balance", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "token", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "born", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "score", "type": "double"},
    ],
}
#: What a newer reader expects: fields dropped, one added with a default.
READER = {
    "type": "record", "name": "BenchCustomer", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "score", "type": "double"}, {"name": "segment", "type": "string", "default": "retail"},
    ],
}


def customer(i: int) -> dict[str, Any]:
    return {
        "id": i, "name": f"customer {i}", "email": None if i % 3 else f"c{i}@example.com",
        "address": {"street": f"{i} Main Street", "city": "Utrecht", "zip": 3500 + i % 100},
        "balance": decimal.Decimal(i % 100000) / 100,
        "created": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i),
        "token": uuid.UUID(int=i), "born": datetime.date(1980, 1, 1) + datetime.timedelta(days=i % 10000),
        "tags": {"tier": "gold" if i % 2 else "silver", "source": "web"}, "score": i / 7,
    }


def _time(decode_all: Callable[[], list[Any]], count: int, results: list[float]) -> None:
    """One pass of ``decode_all``: its records/s appended to ``results``."""
    gc.collect()
    started = time.perf_counter()
    decode_all()
    results.append(count / (time.perf_counter() - started))


def run(url: str, records: int, rounds: int) -> dict[str, float]:
    from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentAvro
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from asyncconsumer.schema_registry import AvroDeserializer, SchemaRegistryClient

    confluent_client = ConfluentClient({"url": url})
    context = SerializationContext("bench-avro", MessageField.VALUE)
    serializer = AvroSerializer(confluent_client, json.dumps(CUSTOMER))
    data = [serializer(customer(i), context) for i in range(records)]
    ours_context = None
    rates: dict[str, float] = {}

    async def main() -> None:
        async with SchemaRegistryClient(url) as client:
            for label, reader in (("writer schema", None), ("reader schema", READER)):
                ours = AvroDeserializer(client, reader_schema=json.dumps(reader) if reader else None)
                theirs = ConfluentAvro(confluent_client, json.dumps(reader) if reader else None)
                first = ours.deserialize(data[0], ours_context)
                if inspect.isawaitable(first):
                    await first  # fetch and compile the schema once; everything below is the cached path

                def decode_ours(d: AvroDeserializer = ours) -> list[Any]:
                    return [d.deserialize(value, ours_context) for value in data]

                def decode_theirs(d: Any = theirs) -> list[Any]:
                    return [d(value, context) for value in data]

                assert decode_ours() == decode_theirs(), "the two deserializers disagree"
                ours_rates: list[float] = []
                their_rates: list[float] = []
                for round_ in range(rounds):
                    pair = [(decode_ours, ours_rates), (decode_theirs, their_rates)]
                    for decode_all, results in pair if round_ % 2 == 0 else reversed(pair):
                        _time(decode_all, records, results)
                rates[f"asyncconsumer, {label}"] = max(ours_rates)
                rates[f"confluent-kafka, {label}"] = max(their_rates)

    anyio.run(main)
    return rates


def report(rates: dict[str, float], records: int, rounds: int) -> str:
    lines = [
        f"Avro decode, {records} records of a 10-field customer record, best of {rounds} rounds (records/s)",
        "",
        "| schema | asyncconsumer | confluent-kafka | ratio |",
        "|---|---:|---:|---:|",
    ]
    for label in ("writer schema", "reader schema"):
        ours, theirs = rates[f"asyncconsumer, {label}"], rates[f"confluent-kafka, {label}"]
        lines.append(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--registry-url", default=None, help="a running registry (default: start Apicurio)")
    args = parser.parse_args(argv)
    if args.registry_url:
        rates = run(args.registry_url, args.records, args.rounds)
    else:
        from asyncconsumer.testing import SchemaRegistry

        print("starting the test schema registry (Apicurio) ...", file=sys.stderr, flush=True)
        with SchemaRegistry() as registry:
            rates = run(registry.url, args.records, args.rounds)
    print(report(rates, args.records, args.rounds))


if __name__ == "__main__":
    main()
