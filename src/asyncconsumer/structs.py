"""Plain value types shared by every layer (no I/O, no behaviour)."""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Generic, Literal, NamedTuple, Protocol, TypeVar

KT = TypeVar("KT")
VT = TypeVar("VT")
T_co = TypeVar("T_co", covariant=True)

#: ``ConsumerRecord.timestamp_type`` values (Kafka's batch attribute bit 3).
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class TopicPartition(NamedTuple):
    """A topic name and a partition number; hashable, usable as a dict key."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[TopicPartition]]:
    """The partitions grouped by topic, topics in order of first appearance (as requests list them)."""
    grouped: dict[str, list[TopicPartition]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp)
    return grouped


class ConsumerRecord(NamedTuple, Generic[KT, VT]):
    """One record as handed to the application.

    A tuple subclass: records are built by the thousand per fetch, and a tuple
    costs a fraction of an object with ``__init__`` (see docs/performance.md).
    Field names follow aiokafka's ``ConsumerRecord`` so code can move over.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: KT | None
    value: VT | None
    serialized_key_size: int
    serialized_value_size: int
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class ShareConsumerRecord(NamedTuple, Generic[KT, VT]):
    """A record as a share consumer hands it out: a ``ConsumerRecord`` plus the delivery count and
    the acquisition lock's deadline."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: KT | None
    value: VT | None
    serialized_key_size: int
    serialized_value_size: int
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int | None = None
    #: 1 on the first delivery, 2 after one release or lock expiry, ...
    delivery_count: int = 1
    #: When the acquisition lock runs out, on ``time.monotonic()``'s clock (computed when the
    #: records arrived, so slightly later than the broker's own deadline).
    lock_deadline: float = 0.0

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclasses.dataclass(frozen=True, slots=True)
class DeserializationContext:
    """Where the bytes a deserializer is given come from: the record's place and headers, and
    whether they are its key or its value.  Passed to a :class:`RecordDeserializer` and to an
    ``async def`` deserializer (docs/typed-records.md)."""

    topic: str
    partition: int
    offset: int
    #: Which part of the record is being deserialized.
    field: Literal["key", "value"]
    #: The record's headers, as ``ConsumerRecord.headers`` has them.
    headers: Sequence[tuple[str, bytes | None]]


class RecordDeserializer(Protocol[T_co]):
    """An object that deserializes with the record's context (``key_deserializer=`` or
    ``value_deserializer=``).

    ``deserialize`` returns the value directly when it can (the fast path: e.g. a schema already
    cached), or an awaitable when it must wait for something (e.g. one registry request for an
    unknown schema id; every record and task needing the same id awaits the same in-flight
    request).  The consumer awaits it on the polling task before it hands the record out.  What it
    raises (or its awaitable raises) is a ``RecordDeserializationError`` handled by the
    ``on_deserialization_error`` policy.  Never called for a ``None`` key or value.
    """

    def deserialize(self, data: bytes, context: DeserializationContext) -> T_co | Awaitable[T_co]: ...


class AcknowledgeType(enum.IntEnum):
    """How a share consumer acknowledges a record (the protocol's values)."""

    #: Processed: the record is done for the whole group.
    ACCEPT = 1
    #: Not processed: give it back for another delivery (``delivery_count`` grows).
    RELEASE = 2
    #: Cannot be processed: archive it, never deliver it again.
    REJECT = 3
    #: Still working: extend the acquisition lock (KIP-1222; brokers with ShareAcknowledge v2).
    RENEW = 4


class OffsetAndMetadata(NamedTuple):
    """An offset to commit (the *next* offset to read) with optional metadata."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None


class OffsetAndTimestamp(NamedTuple):
    """Result of ``Consumer.offsets_for_times``: first offset at/after a time."""

    offset: int
    timestamp: int
    leader_epoch: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class OAuthBearerToken:
    """An OAUTHBEARER token with what the client needs to know about it.

    ``value`` is the token itself (typically a JWT).  ``expires_at`` is its expiry as a Unix time in
    seconds (a JWT's ``exp`` claim; for a plain string token the client reads ``exp`` itself when the
    token is a JWT): the client asks the provider for a new token once 80 % of the time from getting it
    to ``expires_at`` has passed.  ``extensions`` are SASL extensions sent with the token (KIP-342),
    such as ``{"logicalCluster": "lkc-1"}``; keys are letters only and ``auth`` is reserved.
    Its ``repr`` leaves ``value`` out: the token is a credential.
    """

    value: str = dataclasses.field(repr=False)
    expires_at: float | None = None
    extensions: Mapping[str, str] = dataclasses.field(default_factory=dict)


# -- exactly-once (KIP-447): the group metadata a transactional producer commits offsets with ------

#: librdkafka's serialized consumer group metadata starts with these 7 bytes (format v2).
_LIBRDKAFKA_CGMD_MAGIC = b"CGMDv2:"


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What a transactional producer sends with the offsets it commits for a consumer (KIP-447), as
    Java's ``ConsumerGroupMetadata``: ``Consumer.group_metadata()`` returns it.

    The group coordinator accepts the offsets only from the member that owns the partitions now:
    the generation (the member epoch with ``group_protocol="consumer"``) and the member id must
    be the group's current ones, so a member that was fenced meanwhile (a zombie) cannot commit.
    Hand it to your producer: ``for_confluent_kafka()`` for confluent-kafka's
    ``Producer.send_offsets_to_transaction(offsets, group_metadata)``; aiokafka's
    ``send_offsets_to_transaction(offsets, group_id)`` takes ``group_id`` alone (that producer sends
    no generation, so the broker cannot fence a zombie's commit; see docs/exactly-once.md).
    """

    group_id: str
    #: The group generation (classic protocol) or the member epoch (KIP-848); -1 before the
    #: member first joined, and with manual assignment (``assign()``).
    generation_id: int
    #: The member id the coordinator knows this member by; ``""`` before it first joined.
    member_id: str
    #: ``group_instance_id`` (static membership), or None.
    group_instance_id: str | None = None

    def for_confluent_kafka(self) -> bytes:
        """This metadata as confluent-kafka's ``Producer.send_offsets_to_transaction`` takes it:
        librdkafka's serialized group metadata (format v2), byte for byte what confluent-kafka's own
        ``Consumer.consumer_group_metadata()`` returns for the same group, generation, member id
        and instance id.

        Raises ``ValueError`` when a name is not what librdkafka accepts there: printable ASCII
        (librdkafka's reader refuses anything else; with the classic protocol a member id is the
        ``client_id`` followed by a UUID, so a ``client_id`` outside printable ASCII shows up here).
        """
        names = [("group_id", self.group_id), ("member_id", self.member_id)]
        if self.group_instance_id is not None:
            names.append(("group_instance_id", self.group_instance_id))
        for field, value in names:
            if not all(" " <= c <= "~" for c in value):
                raise ValueError(
                    f"{field} {value!r} cannot go to confluent-kafka's send_offsets_to_transaction: librdkafka "
                    "takes only printable ASCII there (characters ' ' to '~')")
        if not -(2**31) <= self.generation_id < 2**31:
            raise ValueError(f"generation_id {self.generation_id} is not a 32-bit integer")
        # Layout: the magic, the generation as librdkafka's int32 in this machine's byte order (it
        # copies the int's memory), then NUL-terminated strings and a null flag for the instance id.
        out = [_LIBRDKAFKA_CGMD_MAGIC, struct.pack("=i", self.generation_id),
               self.group_id.encode("ascii"), b"\0", self.member_id.encode("ascii"), b"\0"]
        if self.group_instance_id is None:
            out.append(b"\x01")
        else:
            out += [b"\x00", self.group_instance_id.encode("ascii"), b"\0"]
        return b"".join(out)
