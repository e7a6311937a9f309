"""The pytest plugin's ``schema_registry`` fixture (imported by ``pytest_plugin``, which the
``pytest11`` entry point registers): a real schema registry for the test session.

    def test_orders(schema_registry, kafka_topic, kafka_produce):
        client = SchemaRegistryClient(schema_registry.url)   # Confluent's API on Apicurio
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .schema_registry import SchemaRegistry

__all__ = ["schema_registry"]


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistry]:
    """Apicurio Registry for the session (``.url`` is its Confluent-compatible API), started on a
    free loopback port on first use and stopped at the end; built once with Maven (Java 17+ and
    ``mvn`` needed; see ``asyncconsumer.testing.SchemaRegistry``)."""
    from .schema_registry import SchemaRegistry  # here: loading the plugin imports nothing heavy

    with SchemaRegistry() as registry:
        yield registry
