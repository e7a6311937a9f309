"""``valueFormat=avro`` / ``keyFormat=avro``: a topic written by confluent-kafka's ``AvroSerializer``
through a real registry (Apicurio) read by the source into typed columns, the rows those that
from_avro-style decoding of the same records gives (confluent's ``AvroDeserializer`` output,
reshaped as Spark's from_avro shapes it: support/avro_columns.py); the reader schema by default the
subject's latest version, or the one given; the registry options checked, their secrets hidden.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql.pandas.types import from_arrow_type
from support.avro_columns import from_avro_customer, from_avro_reader
from support.registry_data import ADDRESS, CUSTOMER_FIELDS, CUSTOMER_READER, Serdes, customer, theirs

from asyncconsumer.schema_registry.arrow import avro_arrow_type
from asyncconsumer.spark.arrow import column_types
from asyncconsumer.spark.options import SourceOptionError, parse_options

#: The first test here may start the session's Spark, Apicurio and broker: on a loaded machine, more
#: than the default 120 s.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
pytest_plugins = ["support.registry_fixtures"]

COUNT = 10
CUSTOMER_V2 = {
    "type": "record", "name": "Customer", "namespace": "sr.avro",
    "fields": [*CUSTOMER_FIELDS, {"name": "vip", "type": "boolean", "default": False}],
}


@pytest.fixture(scope="module")
def avro_topic(bootstrap: str, serdes: Serdes) -> dict[str, Any]:
    """One topic: Avro string keys, version 1 customers, a tombstone, then version 2 customers
    (the subject's latest), all written by confluent-kafka's serializers."""
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from support.producer import create_topic, produce

    topic = create_topic(bootstrap, f"spark-avro-{uuid.uuid4().hex[:8]}", 1)
    keys = AvroSerializer(serdes.client, json.dumps("string"), conf={"auto.register.schemas": True})
    v1 = serdes.avro(topic, COUNT)
    v2_schema = Schema(json.dumps(CUSTOMER_V2), "AVRO", [SchemaReference("sr.avro.Address", "sr.avro.Address", 1)])
    v2_write = AvroSerializer(serdes.client, v2_schema, conf={"auto.register.schemas": True})
    v2 = [v2_write({**customer(i), "vip": i % 2 == 0}, serdes.ctx(topic)) for i in range(COUNT, 2 * COUNT)]
    values: list[bytes | None] = [*v1, None, *v2]
    key_ctx = SerializationContext(topic, MessageField.KEY)
    produce(bootstrap, topic, [(0, keys(f"k{i}", key_ctx), v) for i, v in enumerate(values)])
    return {"topic": topic, "values": values}


def avro_read(spark: Any, bootstrap: str, topic: str, url: str, **options: str) -> Any:
    reader = (
        spark.read.format("asyncconsumer")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("valueFormat", "avro")
        .option("schemaRegistryUrl", url)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def collect_arrow(df: Any) -> pa.Table:
    """``df``'s rows as Arrow, by offset.  Not ``df.toArrow()``: PySpark casts its result to the
    schema, and Spark's JVM writes nulls into the fields of a null struct, so the cast fails where
    a nullable record (``["null", record]``, a union's member) has fields that are not nullable;
    Spark's own ``from_avro`` columns have the same types (docs/spark.md)."""
    return pa.Table.from_batches(df._collect_as_arrow()).sort_by("offset")


def test_values_and_keys_are_typed_columns_with_from_avro_rows(
    spark: Any, bootstrap: str, serdes: Serdes, avro_topic: dict[str, Any]
) -> None:
    topic, values = avro_topic["topic"], avro_topic["values"]
    df = avro_read(spark, bootstrap, topic, serdes.url, keyFormat="avro")
    # the reader schema is the subject's latest version (2), as from_avro with the registry
    latest = avro_arrow_type(CUSTOMER_V2, references=[ADDRESS])
    assert df.schema["value"].dataType == from_arrow_type(latest)
    assert df.schema["key"].dataType == from_arrow_type(pa.string())
    table = collect_arrow(df)
    assert table.column("offset").to_pylist() == list(range(len(values)))
    assert table.column("key").to_pylist() == [f"k{i}" for i in range(len(values))]
    confluent = serdes.avro_deserializer(return_record_name=True)
    expected = [
        None if v is None else {"vip": False, **from_avro_customer(theirs(confluent, v, topic))} for v in values
    ]
    assert table.column("value").to_pylist() == expected
    assert expected[COUNT + 1]["vip"] is True  # written by version 2


def test_a_reader_schema_resolves_every_writer_version(
    spark: Any, bootstrap: str, serdes: Serdes, avro_topic: dict[str, Any]
) -> None:
    topic, values = avro_topic["topic"], avro_topic["values"]
    df = avro_read(spark, bootstrap, topic, serdes.url, valueSchema=json.dumps(CUSTOMER_READER))
    assert df.schema["value"].dataType == from_arrow_type(avro_arrow_type(CUSTOMER_READER))
    assert df.schema["key"].dataType == from_arrow_type(pa.binary())
    confluent = serdes.avro_deserializer(reader=CUSTOMER_READER)
    rows = collect_arrow(df).column("value").to_pylist()
    assert rows == [None if v is None else from_avro_reader(theirs(confluent, v, topic)) for v in values]


# -- the options -----------------------------------------------------------------------------------------

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "orders"}


def test_registry_options_hide_their_secrets() -> None:
    options = parse_options({
        **BASE, "valueFormat": "avro", "schemaRegistryUrl": "https://alice:url-secret@registry:8081",
        "schemaRegistry.basic.auth.user.info": "key:user-info-secret",
        "schemaRegistry.ssl.key.password": "key-secret",
    })
    assert options.value_format is not None and options.value_format.subject == "orders-value"
    shown = repr(options)
    assert "registry:8081" in shown and "basic.auth.user.info" in shown
    assert not any(secret in shown for secret in ("url-secret", "user-info-secret", "key-secret", "alice"))
    with pytest.raises(SourceOptionError) as error:
        parse_options({**BASE, "valueFormat": "avro", "schemaRegistryUrl": "ftp://alice:url-secret@registry"})
    assert "url-secret" not in str(error.value)
    with pytest.raises(SourceOptionError, match="'user:password'") as error:
        parse_options({**BASE, "valueFormat": "avro", "schemaRegistryUrl": "http://r",
                       "schemaRegistry.basic.auth.user.info": "no-colon-secret"})
    assert "no-colon-secret" not in str(error.value)


@pytest.mark.parametrize("options,message", [
    ({"valueFormat": "avro"}, "need 'schemaRegistryUrl'"),
    ({"valueFormat": "json", "schemaRegistryUrl": "http://r"}, "'valueFormat' must be one of binary, avro"),
    ({"valueFormat": "avro", "schemaRegistryUrl": "http://r", "valueSchema": '"string"',
      "valueSchemaSubject": "s"}, "not both"),
    ({"schemaRegistryUrl": "http://r"}, "neither is set"),
    ({"valueSchema": '"string"'}, "'valueSchema' is for valueFormat=avro"),
    ({"valueFormat": "avro", "schemaRegistryUrl": "http://r", "schemaRegistry.ssl.ca.locaton": "x"},
     "did you mean 'schemaRegistry.ssl.ca.location'"),
    ({"valueFormat": "avro", "schemaRegistryUrl": "http://r", "subscribe": "a,b"}, "more than one topic"),
    ({"valueFormat": "avro", "schemaRegistryUrl": "http://r", "valueSchema": "{not json"}, "not an Avro schema"),
])
def test_bad_format_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options({**BASE, **options})


def test_the_driver_pins_the_latest_version_and_names_a_missing_subject(serdes: Serdes) -> None:
    serdes.register("spark-avro-pinned-value", json.dumps("string"), "AVRO")
    options = parse_options({**BASE, "valueFormat": "avro", "schemaRegistryUrl": serdes.url,
                             "valueSchemaSubject": "spark-avro-pinned-value"})
    pinned, key_type, value_type = anyio.run(column_types, options)
    assert (key_type, value_type) == (None, pa.string())
    assert pinned.value_format is not None and pinned.value_format.version == 1
    missing = parse_options({**BASE, "valueFormat": "avro", "schemaRegistryUrl": serdes.url,
                             "valueSchemaSubject": "no-such-subject-value"})
    with pytest.raises(SourceOptionError, match=r"valueFormat=avro with subject 'no-such-subject-value'.*404"):
        anyio.run(column_types, missing)


def test_registry_tls_options_make_the_client_context(tmp_path: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    from asyncconsumer.spark.arrow import registry_client
    from asyncconsumer.testing.certs import generate_certs

    tls = generate_certs(tmp_path)
    key = serialization.load_pem_private_key(tls.client_key_file.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"key-secret")))
    tls_options = {
        **BASE, "valueFormat": "avro", "schemaRegistryUrl": "https://registry:8081",
        "schemaRegistry.ssl.ca.location": str(tls.ca_file),
        "schemaRegistry.ssl.certificate.location": str(tls.client_cert_file),
        "schemaRegistry.ssl.key.location": str(encrypted),
    }
    # an encrypted key without its password: an error naming the option, never a pass-phrase prompt
    without = parse_options(tls_options)
    assert without.registry is not None
    with pytest.raises(SourceOptionError, match=r"schemaRegistry\.ssl"):
        registry_client(without.registry)
    with_password = parse_options({**tls_options, "schemaRegistry.ssl.key.password": "key-secret"})
    assert with_password.registry is not None
    client = registry_client(with_password.registry)
    assert "key-secret" not in repr(client) and "key-secret" not in repr(with_password)
    anyio.run(client.aclose)
