"""What ``asyncconsumer produce`` and ``asyncconsumer broker --topic`` say to a broker.

asyncconsumer is a consumer: it has no producer, and these two commands only need one for trying
things (a few records typed or piped in, a topic created).  They speak through the consumer's own
:class:`~asyncconsumer.engine.connection.BrokerConnection` (version negotiation, request timeouts,
typed errors), one connection per broker, with three requests:

- ``Metadata`` for the topic (``allow_auto_topic_creation``, as Kafka's producer asks), retried
  while the topic has no leader yet;
- ``CreateTopics`` (replication factor and configuration: the broker's defaults);
- ``Produce`` with ``acks=-1`` (all in-sync replicas, the producer's default), one v2 record batch
  per partition written by :mod:`asyncconsumer.protocol.record_writer`, no idempotence, no
  compression.  A partition whose leader moved is sent again after a metadata refresh.

Keyed records go where Kafka's producer puts them (:func:`partition_for_key`, murmur2 as in
``Utils.murmur2``); records without a key go to one partition per batch (as the sticky partitioner
does).  A ``ConsumerConfig`` given as ``security`` secures the connections as the consumer's are:
TLS (``ConsumerConfig.tls_context``) and a SASL login with PLAIN or SCRAM
(OAUTHBEARER is refused: its token cache belongs to the consumer's loop).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from ..config import ConsumerConfig, parse_host_port
from ..engine.connection import BrokerConnection, SaslHook
from ..engine.sasl import create_mechanism
from ..errors import (
    REFRESH_METADATA_CODES,
    ConfigError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from ..protocol.record_writer import Record, build_batch

__all__ = ["ProduceClient", "TopicLayout", "partition_for_key"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def _murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (32-bit MurmurHash2, seed 0x9747b28c), as an unsigned 32-bit value."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's producer (Java, and librdkafka's ``murmur2_random``) picks for ``key``."""
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class TopicLayout:
    """A topic's partitions and the node leading each (-1: none yet)."""

    name: str
    leaders: Mapping[int, int]

    @property
    def partitions(self) -> int:
        return len(self.leaders)


class ProduceClient:
    """``async with ProduceClient("host:port,...") as client:``: connections opened on first use."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "asyncconsumer-cli",
        request_timeout: float = 30.0,
        security: ConsumerConfig | None = None,
    ) -> None:
        self._bootstrap = [parse_host_port(s.strip()) for s in bootstrap.split(",") if s.strip()]
        if not self._bootstrap:
            raise KafkaError("no bootstrap server given")
        self._ssl_context = security.tls_context() if security is not None else None
        self._sasl: SaslHook | None = None
        if security is not None and security.uses_sasl:
            if security.sasl_mechanism == "OAUTHBEARER":
                raise ConfigError("sasl.mechanism OAUTHBEARER: this command logs in with PLAIN or SCRAM only")
            mechanism = (security.sasl_mechanism, security.sasl_plain_username, security.sasl_plain_password)

            async def log_in(connection: BrokerConnection) -> int:
                return await connection.log_in(create_mechanism(*mechanism, None))

            self._sasl = log_in
        self._client_id = client_id
        self._timeout = request_timeout
        self._brokers: dict[int, tuple[str, int]] = {}
        self._connections: dict[int, BrokerConnection] = {}
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        for connection in self._connections.values():
            await connection.aclose()
        self._connections.clear()
        assert self._group is not None
        self._group.cancel_scope.cancel()
        return await self._group.__aexit__(exc_type, exc, tb)

    # -- connections --------------------------------------------------------------------------------

    async def _open(self, node_id: int, host: str, port: int) -> BrokerConnection:
        assert self._group is not None
        connection = BrokerConnection(
            node_id, host, port, client_id=self._client_id, request_timeout=self._timeout,
            setup_timeout=min(10.0, self._timeout), ssl_context=self._ssl_context, sasl=self._sasl,
        )
        await connection.open(self._spawn)
        self._connections[node_id] = connection
        return connection

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._group is not None
        self._group.start_soon(fn, *args)

    async def _connection(self, node_id: int | None) -> BrokerConnection:
        """The connection to ``node_id`` (None: any broker, the bootstrap servers first)."""
        if node_id is None:
            for connection in self._connections.values():
                if connection.connected:
                    return connection
            failures = []
            for index, (host, port) in enumerate(self._bootstrap):
                try:
                    return await self._open(-(index + 1), host, port)
                except KafkaConnectionError as exc:
                    failures.append(str(exc))
            raise NoBrokersAvailableError(f"no broker reachable: {'; '.join(failures)}")
        known = self._connections.get(node_id)
        if known is not None and known.connected:
            return known
        address = self._brokers.get(node_id)
        if address is None:
            raise KafkaConnectionError(f"no address known for broker {node_id}")
        return await self._open(node_id, *address)

    async def _request(self, node_id: int | None, api: str, body: dict[str, Any], **versions: int) -> dict[str, Any]:
        connection = await self._connection(node_id)
        version = connection.choose_version(api, **versions)
        return await connection.request_version(api, version, body)

    # -- requests -----------------------------------------------------------------------------------

    async def topic(self, name: str, *, create: bool = True, timeout: float = 10.0) -> TopicLayout:
        """The topic's partitions and leaders; with ``create``, the broker may create it (its
        ``auto.create.topics.enable``).  Waits up to ``timeout`` s for every partition to have a leader."""
        deadline = time.monotonic() + timeout
        while True:
            body = {"topics": [{"name": name, "topic_id": b"\0" * 16}], "allow_auto_topic_creation": create,
                    "include_topic_authorized_operations": False}
            response = await self._request(None, "Metadata", body, min_version=4)
            self._brokers.update({b["node_id"]: (b["host"], b["port"]) for b in response["brokers"]})
            found = next((t for t in response["topics"] if t["name"] == name), None)
            error: KafkaError | None = None
            if found is None:
                error = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            elif found["error_code"]:
                error = error_for_code(found["error_code"], f"topic {name!r}")
            else:
                leaders = {p["partition_index"]: p["leader_id"] for p in found["partitions"]}
                if leaders and all(leader >= 0 for leader in leaders.values()):
                    return TopicLayout(name, leaders)
                error = KafkaTimeoutError(f"topic {name!r} has partitions without a leader")
            if not (error.retriable or isinstance(error, UnknownTopicOrPartitionError)):
                raise error
            if time.monotonic() >= deadline:
                if isinstance(error, UnknownTopicOrPartitionError):
                    raise UnknownTopicOrPartitionError(
                        f"topic {name!r} does not exist (and the broker did not create it)"
                    ) from None
                raise error
            await anyio.sleep(0.1)

    async def create_topic(self, name: str, partitions: int, *, timeout: float = 30.0) -> bool:
        """Create ``name`` with ``partitions`` (the broker's replication factor); False when it
        exists already.  Returns once its partitions have leaders."""
        body = {
            "topics": [{"name": name, "num_partitions": partitions, "replication_factor": -1,
                        "assignments": [], "configs": []}],
            "timeout_ms": int(timeout * 1000),
            "validate_only": False,
        }
        response = await self._request(None, "CreateTopics", body)
        created = True
        for result in response["topics"]:
            code = result["error_code"]
            if code == TopicAlreadyExistsError.code:
                created = False
            elif code:
                message = result.get("error_message") or ""
                raise error_for_code(code, f"creating topic {name!r}{': ' + message if message else ''}")
        await self.topic(name, create=False, timeout=timeout)
        return created

    async def produce(
        self,
        layout: TopicLayout,
        batches: Mapping[int, Sequence[Record]],
        *,
        attempts: int = 5,
    ) -> TopicLayout:
        """Write each partition's records as one batch (acks=-1).  A partition whose leader moved
        is sent again after a metadata refresh; returns the layout in use at the end."""
        pending = {p: list(records) for p, records in batches.items() if records}
        for attempt in range(attempts):
            by_leader: dict[int, dict[int, list[Record]]] = {}
            for partition, records in pending.items():
                by_leader.setdefault(layout.leaders[partition], {})[partition] = records
            timestamp = int(time.time() * 1000)
            retry: dict[int, list[Record]] = {}
            for leader, parts in by_leader.items():
                body = {
                    "transactional_id": None,
                    "acks": -1,
                    "timeout_ms": int(self._timeout * 1000),
                    "topic_data": [{
                        "name": layout.name,
                        "partition_data": [
                            {"index": p, "records": build_batch(records, base_timestamp=timestamp)}
                            for p, records in sorted(parts.items())
                        ],
                    }],
                }
                try:
                    response = await self._request(leader, "Produce", body, max_version=12)
                except KafkaConnectionError:
                    if attempt + 1 == attempts:
                        raise
                    retry.update(parts)
                    continue
                for topic in response["responses"]:
                    for answer in topic["partition_responses"]:
                        code = answer["error_code"]
                        if not code:
                            continue
                        partition = answer["index"]
                        error = error_for_code(code, f"producing to {layout.name}-{partition}")
                        if code in REFRESH_METADATA_CODES or error.retriable:
                            retry[partition] = parts[partition]
                        else:
                            raise error
            if not retry:
                return layout
            pending = retry
            await anyio.sleep(min(1.0, 0.1 * 2**attempt) * random.uniform(0.8, 1.2))
            layout = await self.topic(layout.name, create=False)
        raise KafkaTimeoutError(
            f"producing to {layout.name} partitions {sorted(pending)} failed {attempts} times (their leaders moved?)"
        )
