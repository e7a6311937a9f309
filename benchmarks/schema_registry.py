"""Avro decode speed: asyncconsumer.schema_registry's ``AvroDeserializer`` and ``AvroColumns`` against
confluent-kafka's ``AvroDeserializer``, side by side on the same records, in one run.

``python -m benchmarks.schema_registry [--records N] [--rounds R] [--registry-url URL]
[--broker kafka|tansu] [--spark] [--spark-avro-version V]``

Starts the test registry (Apicurio, ``asyncconsumer.testing.SchemaRegistry``) unless
``--registry-url`` names one, writes N records with confluent-kafka's ``AvroSerializer`` (a
customer record: longs, strings, a nested record, a union, a map, decimal, timestamp-millis, uuid
and date logical types), then decodes all of them with each deserializer, schemas cached (one warm-up
pass each), R rounds alternating which goes first, best round of each.  Also with a reader schema
(schema resolution).  Both give the same values (checked).  Prints records/s and the ratio.

Then the columnar decoders on the same records: ``AvroColumns.decode_column`` (a column of 10,000
records into one Arrow struct column, as ``arrow_batches(value_format=...)`` does) against the row
path's ``AvroDeserializer`` (a dict per record) and confluent-kafka's.

``--broker``: end to end from a broker (one partition, the records produced once by confluent-kafka):
``arrow_batches(value_format=AvroColumns(...))`` against ``batches()`` with ``AvroDeserializer``
called on each record, each round a fresh consumer reading the topic from the start.

``--spark`` (with ``--broker``): the PySpark source with ``valueFormat=avro`` against the same source
reading binary values decoded by Spark's own ``from_avro`` (``spark-avro``, resolved from Maven
Central, ``--spark-avro-version``, default the installed PySpark's; open-source ``from_avro`` does
not read the registry's framing, so it gets ``substring(value, 6)`` and the writer schema), both
written to Spark's ``noop`` sink, ``local[2]``.

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


#: Records per column given to ``AvroColumns.decode_column`` (``arrow_batches()``'s default batch).
COLUMN_BATCH = 10_000


def run_columns(url: str, records: int, rounds: int) -> dict[str, float]:
    """records/s: ``AvroColumns`` (to Arrow) against ``AvroDeserializer`` and confluent's (to dicts)."""
    import pyarrow as pa
    from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentAvro
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from asyncconsumer.app.arrow import ColumnContext
    from asyncconsumer.schema_registry import AvroColumns, AvroDeserializer, SchemaRegistryClient

    confluent_client = ConfluentClient({"url": url})
    context = SerializationContext("bench-avro", MessageField.VALUE)
    serializer = AvroSerializer(confluent_client, json.dumps(CUSTOMER))
    data = [serializer(customer(i), context) for i in range(records)]
    columns = [pa.array(data[i : i + COLUMN_BATCH], pa.binary()) for i in range(0, records, COLUMN_BATCH)]
    contexts = [ColumnContext("bench-avro", 0, "value", pa.array(range(len(c)), pa.int64())) for c in columns]
    rates: dict[str, list[float]] = {"AvroColumns": [], "AvroDeserializer": [], "confluent-kafka": []}

    async def main() -> None:
        async with SchemaRegistryClient(url) as client:
            ours_columns = AvroColumns(client)
            ours_rows = AvroDeserializer(client)
            theirs = ConfluentAvro(confluent_client)
            first = ours_rows.deserialize(data[0], None)
            if inspect.isawaitable(first):
                await first
            decoded = await ours_columns.decode_column(columns[0], contexts[0])  # the schema fetched once
            assert decoded.to_pylist()[1]["name"] == "customer 1"

            async def decode_columns() -> None:
                for column, ctx in zip(columns, contexts, strict=True):
                    await ours_columns.decode_column(column, ctx)

            def decode_rows() -> list[Any]:
                return [ours_rows.deserialize(value, None) for value in data]

            def decode_theirs() -> list[Any]:
                return [theirs(value, context) for value in data]

            for round_ in range(rounds):
                order = ["AvroColumns", "AvroDeserializer", "confluent-kafka"]
                for name in order[round_ % 3 :] + order[: round_ % 3]:
                    gc.collect()
                    started = time.perf_counter()
                    if name == "AvroColumns":
                        await decode_columns()
                    else:
                        (decode_rows if name == "AvroDeserializer" else decode_theirs)()
                    rates[name].append(records / (time.perf_counter() - started))

    anyio.run(main)
    return {name: max(values) for name, values in rates.items()}


def run_broker(url: str, broker_choice: str | None, records: int, rounds: int) -> tuple[dict[str, float], str, Any]:
    """records/s read from a broker: ``arrow_batches()`` + ``AvroColumns`` against ``batches()`` +
    ``AvroDeserializer``.  Returns the rates, the broker's description, and the started broker
    (with its topic, for ``--spark``)."""
    import uuid

    from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from asyncconsumer import Consumer, TopicPartition
    from asyncconsumer.schema_registry import AvroColumns, AvroDeserializer, SchemaRegistryClient
    from asyncconsumer.testing.producer import create_topic, produce
    from benchmarks import brokers

    broker = brokers.start(broker_choice, lambda message: print(message, file=sys.stderr, flush=True))
    topic = create_topic(broker.bootstrap, f"bench-avro-{uuid.uuid4().hex[:8]}", 1)
    serializer = AvroSerializer(ConfluentClient({"url": url}), json.dumps(CUSTOMER))
    context = SerializationContext(topic, MessageField.VALUE)
    produce(broker.bootstrap, topic, ((0, None, serializer(customer(i), context)) for i in range(records)),
            linger_ms=20, batch_size=1 << 20)
    tp = TopicPartition(topic, 0)
    rates: dict[str, list[float]] = {"arrow_batches + AvroColumns": [], "batches + AvroDeserializer": []}

    async def read(name: str, client: SchemaRegistryClient) -> float:
        async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                            max_partition_fetch_bytes=4 << 20) as consumer:
            consumer.assign([tp])
            seen = 0
            started = time.perf_counter()
            if name.startswith("arrow"):
                async for batch in consumer.arrow_batches(value_format=AvroColumns(client)):
                    seen += batch.num_rows
                    if seen >= records:
                        break
            else:
                deserializer = AvroDeserializer(client)
                async for chunk in consumer.batches(max_records=10_000):
                    for record in chunk:
                        assert record.value is not None
                        value = deserializer.deserialize(record.value, None)
                        if inspect.isawaitable(value):
                            await value
                    seen += len(chunk)
                    if seen >= records:
                        break
            return records / (time.perf_counter() - started)

    async def main() -> None:
        async with SchemaRegistryClient(url) as client:
            for name in rates:  # warm-up: the schema, the broker's cache
                await read(name, client)
            for round_ in range(rounds):
                names = list(rates) if round_ % 2 == 0 else list(reversed(rates))
                for name in names:
                    gc.collect()
                    rates[name].append(await read(name, client))

    anyio.run(main)
    return {name: max(values) for name, values in rates.items()}, broker.description, (broker, topic)


def run_spark(
    url: str, bootstrap: str, topic: str, records: int, rounds: int, avro_version: str | None
) -> dict[str, float]:
    """rows/s of the PySpark source with ``valueFormat=avro`` against the source's binary values
    decoded by Spark's ``from_avro``, both to the ``noop`` sink."""
    import os
    import tempfile

    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import expr

    from asyncconsumer.spark import register
    from benchmarks.spark_head_to_head import kafka_jars

    version = avro_version or pyspark.__version__
    work = tempfile.mkdtemp(prefix="bench-avro-spark-")
    jars = kafka_jars(f"org.apache.spark:spark-avro_2.13:{version}", os.path.join(work, "ivy"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").appName("bench-avro")
        .config("spark.jars", ",".join(jars)).config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC").config("spark.local.dir", work)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def source(**options: str) -> Any:
        reader = (spark.read.format("asyncconsumer").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic))
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    queries = {
        "source valueFormat=avro": lambda: source(valueFormat="avro", schemaRegistryUrl=url),
        "source binary + from_avro": lambda: source().select(
            from_avro(expr("substring(value, 6, length(value) - 5)"), json.dumps(CUSTOMER)).alias("value")),
        "source binary (no decode)": lambda: source(),
    }
    rates: dict[str, list[float]] = {name: [] for name in queries}
    try:
        for name, query in queries.items():  # warm-up, and the same row count from each
            assert query().count() == records, name  # type: ignore[no-untyped-call]
        for round_ in range(rounds):
            names = list(queries)[round_ % len(queries):] + list(queries)[: round_ % len(queries)]
            for name in names:
                started = time.perf_counter()
                queries[name]().write.format("noop").mode("overwrite").save()
                rates[name].append(records / (time.perf_counter() - started))
    finally:
        spark.stop()
    return {name: max(values) for name, values in rates.items()}


def report_table(title: str, rates: dict[str, float], baseline: str) -> str:
    lines = [title, "", "| reader | records/s | vs " + baseline + " |", "|---|---:|---:|"]
    for name, rate in rates.items():
        lines.append(f"| {name} | {rate:,.0f} | {rate / rates[baseline]:.2f}x |")
    return "\n".join(lines)


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
    parser.add_argument("--broker", choices=("kafka", "tansu"), default=None,
                        help="also read the records from this broker, end to end")
    parser.add_argument("--spark", action="store_true", help="also the PySpark source against from_avro (--broker)")
    parser.add_argument("--spark-avro-version", default=None, help="spark-avro's version (default: PySpark's)")
    args = parser.parse_args(argv)
    if args.spark and not args.broker:
        parser.error("--spark needs --broker")
    if args.registry_url:
        print(run_all(args.registry_url, args))
    else:
        from asyncconsumer.testing import SchemaRegistry

        print("starting the test schema registry (Apicurio) ...", file=sys.stderr, flush=True)
        with SchemaRegistry() as registry:
            print(run_all(registry.url, args))


def run_all(url: str, args: argparse.Namespace) -> str:
    parts = [report(run(url, args.records, args.rounds), args.records, args.rounds)]
    parts.append(report_table(
        f"Columns: {args.records} records, {COLUMN_BATCH} a column, writer schema, best of {args.rounds} rounds",
        run_columns(url, args.records, args.rounds), "AvroDeserializer",
    ))
    if args.broker:
        rates, description, (broker, topic) = run_broker(url, args.broker, args.records, args.rounds)
        try:
            parts.append(report_table(
                f"From the broker ({description}): {args.records} records, one partition, best of {args.rounds} rounds",
                rates, "batches + AvroDeserializer",
            ))
            if args.spark:
                spark_rates = run_spark(url, broker.bootstrap, topic, args.records, args.rounds,
                                        args.spark_avro_version)
                parts.append(report_table(
                    f"PySpark, local[2], noop sink: {args.records} records, best of {args.rounds} rounds",
                    spark_rates, "source binary + from_avro",
                ))
        finally:
            broker.stop()
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
