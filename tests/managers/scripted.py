"""A tiny harness for driving the sans-I/O request managers deterministically.

No sockets, no sleeps: a :class:`FakeClock` stands in for ``time.monotonic``,
:class:`Scripted` polls managers the way the background loop does and keeps
what they want to send, and each :class:`Sent` request is answered by the
test with a body or an error.

Request bodies go through the real codec (``encode_request`` then
``decode_request`` at the chosen version), so a manager building a field the
schema does not have, or a non-default value a version cannot carry, fails
the test.  Response bodies are round-tripped through ``encode_response`` /
``decode_response`` by default, so the handlers see exactly what the
connection would hand them (every field filled in, ``records`` as a
``memoryview``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from asyncconsumer.managers.metadata import MetadataManager
from asyncconsumer.managers.requests import Body, UnsentRequest
from asyncconsumer.protocol.api import (
    SUPPORTED_VERSIONS,
    compiled_encoder_writes,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from asyncconsumer.structs import TopicPartition

__all__ = [
    "FakeClock",
    "Scripted",
    "Sent",
    "fetch_body",
    "load_metadata",
    "metadata_body",
    "request_roundtrip",
    "response_roundtrip",
    "topic_id",
]


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class Manager(Protocol):
    def poll(self, now: float) -> list[UnsentRequest]: ...


# -- the codec -------------------------------------------------------------------------------------


def request_roundtrip(api: str, version: int, body: Body) -> Body:
    """``body`` as the broker would decode it (raises if the schema rejects it).  It must be a body
    the compiled encoder writes itself, as every request the managers build is."""
    assert compiled_encoder_writes(api, version, body) is not False, f"{api} v{version}: not plain: {body}"
    frame = encode_request(api, version, body, correlation_id=7, client_id="scripted")
    return decode_request(api, version, frame[4:])[1]


def response_roundtrip(api: str, version: int, body: Body) -> Body:
    """``body`` as the connection would hand it to a manager."""
    frame = encode_response(api, version, body, correlation_id=1)
    return decode_response(api, version, frame[4:])


def version_range(request: UnsentRequest) -> tuple[int, int]:
    lo, hi = SUPPORTED_VERSIONS[request.api]
    if request.max_version is not None:
        hi = min(hi, request.max_version)
    return max(lo, request.min_version), hi


# -- requests --------------------------------------------------------------------------------------


class Sent:
    """One request a manager handed out, waiting for the test to answer it."""

    def __init__(self, request: UnsentRequest, clock: FakeClock, version: int) -> None:
        self.request = request
        self.clock = clock
        self.version = version
        self._body: Body | None = None

    def __repr__(self) -> str:
        return f"<Sent {self.request.api} v{self.version} node={self.request.node_id}>"

    @property
    def api(self) -> str:
        return self.request.api

    @property
    def node_id(self) -> int | None:
        return self.request.node_id

    def at(self, version: int) -> Sent:
        """Send at ``version`` instead (before the body is built)."""
        assert self._body is None, "the body was already built"
        lo, hi = version_range(self.request)
        assert lo <= version <= hi, f"{self.api} v{version} outside the request's range {lo}-{hi}"
        self.version = version
        return self

    def body(self) -> Body:
        """The request body, built once (as the network client does) and checked by the codec."""
        if self._body is None:
            built = self.request.build(self.version)
            self._body = request_roundtrip(self.api, self.version, built)
        return self._body

    def respond(self, body: Body, *, codec: bool = True) -> None:
        self.body()  # the network client always builds before a response can exist
        if codec:
            body = response_roundtrip(self.api, self.version, body)
        self.request.on_response(self.clock.now, self.version, body)

    def fail(self, error: BaseException) -> None:
        self.request.on_error(self.clock.now, error)


class Scripted:
    """Polls managers like the background loop and keeps their requests until answered."""

    def __init__(self, *managers: Manager, clock: FakeClock | None = None,
                 versions: Mapping[str, int] | None = None) -> None:
        self.managers = list(managers)
        self.clock = clock or FakeClock()
        self.versions = dict(versions or {})
        self.pending: list[Sent] = []

    @property
    def now(self) -> float:
        return self.clock.now

    def advance(self, seconds: float) -> float:
        return self.clock.advance(seconds)

    def _version(self, request: UnsentRequest) -> int:
        lo, hi = version_range(request)
        assert lo <= hi, f"{request.api}: empty version range {lo}-{hi}"
        preferred = self.versions.get(request.api)
        return hi if preferred is None else max(lo, min(preferred, hi))

    def poll(self) -> list[Sent]:
        """One loop turn: every manager's new requests (also kept in ``pending``)."""
        new = [Sent(r, self.clock, self._version(r)) for m in self.managers for r in m.poll(self.clock.now)]
        self.pending.extend(new)
        return new

    def sent(self, api: str) -> list[Sent]:
        """Poll, then take every pending request of ``api``."""
        self.poll()
        return self.take_all(api)

    def take_all(self, api: str) -> list[Sent]:
        found = [s for s in self.pending if s.api == api]
        self.pending = [s for s in self.pending if s.api != api]
        return found

    def take(self, api: str, *, poll: bool = True) -> Sent:
        """Exactly one pending request of ``api`` (polling first)."""
        if poll:
            self.poll()
        found = self.take_all(api)
        assert len(found) == 1, f"expected one {api} request, got {found} (pending: {self.pending})"
        return found[0]

    def assert_idle(self, api: str | None = None) -> None:
        """Poll and check nothing (of ``api``) is sent."""
        new = self.poll()
        if api is not None:
            new = [s for s in new if s.api == api]
        assert not new, f"unexpected requests: {new}"


# -- response bodies -------------------------------------------------------------------------------


def topic_id(name: str) -> bytes:
    """A deterministic, non-zero topic id."""
    return hashlib.md5(name.encode()).digest()


Leaders = Mapping[TopicPartition, tuple[int, int]]


def metadata_body(
    leaders: Leaders,
    *,
    brokers: Iterable[int] | None = None,
    topic_ids: Mapping[str, bytes] | None = None,
    topic_errors: Mapping[str, int] | None = None,
) -> Body:
    """A Metadata response: ``leaders`` maps each partition to ``(leader id, leader epoch)``."""
    by_topic: dict[str, list[tuple[int, int, int]]] = {}
    for tp, (leader, epoch) in leaders.items():
        by_topic.setdefault(tp.topic, []).append((tp.partition, leader, epoch))
    if brokers is None:
        brokers = sorted({leader for leader, _ in leaders.values() if leader >= 0} or {0})
    topics: list[Body] = [
        {
            "error_code": 0,
            "name": name,
            "topic_id": (topic_ids or {}).get(name, topic_id(name)),
            "is_internal": False,
            "partitions": [
                {"error_code": 0, "partition_index": p, "leader_id": leader, "leader_epoch": epoch,
                 "replica_nodes": [leader], "isr_nodes": [leader], "offline_replicas": []}
                for p, leader, epoch in sorted(parts)
            ],
        }
        for name, parts in sorted(by_topic.items())
    ]
    for name, code in (topic_errors or {}).items():
        topics.append({"error_code": code, "name": name, "topic_id": bytes(16), "partitions": []})
    return {
        "brokers": [{"node_id": n, "host": f"broker{n}", "port": 9092 + n, "rack": None} for n in brokers],
        "cluster_id": "scripted",
        "controller_id": 0,
        "topics": topics,
    }


def load_metadata(
    metadata: MetadataManager, clock: FakeClock, leaders: Leaders, **kwargs: Any
) -> MetadataManager:
    """Answer ``metadata``'s next request with ``metadata_body(leaders, **kwargs)``, first letting the
    clock run to when it may go (a refresh asked for right after another one waits ``retry_backoff``)."""
    due = metadata.next_deadline(clock.now)
    if clock.now < due < float("inf"):
        clock.advance(due - clock.now)
    requests = metadata.poll(clock.now)
    assert requests, "the metadata manager sent nothing"
    for request in requests:
        sent = Sent(request, clock, version_range(request)[1])
        sent.respond(metadata_body(leaders, **kwargs))
    return metadata


def new_metadata(clock: FakeClock, leaders: Leaders, *, retry_backoff: float = 0.1,
                 topics: Callable[[], set[str]] | None = None, **kwargs: Any) -> MetadataManager:
    """A metadata manager whose cluster already holds ``leaders`` (through its own request path)."""
    interest = topics or (lambda: {tp.topic for tp in leaders})
    manager = MetadataManager(max_age=300.0, retry_backoff=retry_backoff, topics_of_interest=interest,
                              on_update=lambda cluster: None)
    return load_metadata(manager, clock, leaders, **kwargs)


def fetch_partition(partition: int, *, records: bytes | None = b"", error_code: int = 0,
                    high_watermark: int = 0, last_stable_offset: int = -1, log_start_offset: int = 0,
                    aborted: list[tuple[int, int]] | None = None) -> Body:
    return {
        "partition_index": partition,
        "error_code": error_code,
        "high_watermark": high_watermark,
        "last_stable_offset": last_stable_offset,
        "log_start_offset": log_start_offset,
        "aborted_transactions": [{"producer_id": p, "first_offset": o} for p, o in aborted or []],
        "preferred_read_replica": -1,
        "records": records,
    }


def fetch_body(version: int, partitions: Mapping[TopicPartition, Body], *, session_id: int = 0,
               error_code: int = 0, topic_ids: Mapping[str, bytes] | None = None) -> Body:
    """A Fetch response naming topics by name (< v13) or by id (v13+)."""
    by_topic: dict[str, list[Body]] = {}
    for tp, body in partitions.items():
        by_topic.setdefault(tp.topic, []).append(body)
    responses = []
    for name, parts in by_topic.items():
        key: Body = ({"topic_id": (topic_ids or {}).get(name, topic_id(name))} if version >= 13
                     else {"topic": name})
        responses.append({**key, "partitions": parts})
    return {"error_code": error_code, "session_id": session_id, "responses": responses}
