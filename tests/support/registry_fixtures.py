"""The schema registry tests' fixtures, loaded with ``pytest_plugins = ["support.registry_fixtures"]``:
``registry`` (the session's Apicurio, the package plugin's ``schema_registry``) and ``serdes``
(confluent-kafka's serializers and deserializers on it)."""

from __future__ import annotations

import pytest

from asyncconsumer.testing import SchemaRegistry, SchemaRegistryTestError

from .broker import in_ci
from .registry_data import Serdes


@pytest.fixture(scope="session")
def registry(request: pytest.FixtureRequest) -> SchemaRegistry:
    """The plugin's ``schema_registry``; on a developer's machine without Java or Maven, a skip
    (in CI, an error)."""
    try:
        return request.getfixturevalue("schema_registry")  # type: ignore[no-any-return]
    except SchemaRegistryTestError as exc:
        if in_ci():
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def serdes(registry: SchemaRegistry, tmp_path_factory: pytest.TempPathFactory) -> Serdes:
    return Serdes(registry.url, tmp_path_factory.mktemp("proto"))
