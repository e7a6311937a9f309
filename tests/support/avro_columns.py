"""What Spark's ``from_avro`` makes of the schema registry tests' Avro customers, as Arrow's
``to_pylist()`` shows it: the expected values of ``AvroColumns`` and of the PySpark source's
``valueFormat=avro``, derived from confluent-kafka's own ``AvroDeserializer`` output.

from_avro's mapping (Spark's ``SchemaConverters``): a record is a struct, a map a list of
``(key, value)`` pairs in Arrow, a union of several records a struct ``member0``, ``member1`` ...
with the one set, a ``uuid`` a string, an enum its symbol; decimals, dates and timestamps stay as
Python's ``Decimal``, ``date`` and aware ``datetime``.
"""

from __future__ import annotations

import uuid
from typing import Any

#: The union members of the customer's ``contact`` field, in the schema's order.
CONTACT_MEMBERS = ("sr.avro.Email", "sr.avro.Phone")


def from_avro_customer(value: Any) -> Any:
    """A customer (``support.registry_data.CUSTOMER``) as confluent's ``AvroDeserializer`` with
    ``return_record_name=True`` decodes it, as from_avro's column holds it."""
    if value is None:
        return None
    out = dict(value)
    out["token"] = str(out["token"]) if isinstance(out["token"], uuid.UUID) else out["token"]
    contact = out["contact"]
    if contact is not None:
        name, record = contact
        out["contact"] = {f"member{i}": record if member == name else None for i, member in enumerate(CONTACT_MEMBERS)}
    out["tags"] = list(out["tags"].items())
    return out


def from_avro_reader(value: Any) -> Any:
    """A customer read with ``support.registry_data.CUSTOMER_READER`` (nothing to reshape)."""
    return None if value is None else dict(value)
