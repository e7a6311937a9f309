"""One exception hierarchy for everything the consumer raises.

``KafkaError`` is the root.  ``retriable`` tells whether trying the same call
again may succeed.  Broker error codes map to one named class each
(``error_for_code``); the classes are generated into ``_broker_errors``.

Every class users meet lives here, or says it does: the generated classes set
``__module__`` to this module, so a traceback reads
``asyncconsumer.errors.UnknownTopicOrPartitionError`` and pickle finds the class
where users import it.  An instance pickles with its attributes as they are
(``KafkaError.__reduce__``): the subclasses' constructors take other arguments
than the message they build, so unpickling does not call them again.
"""

from __future__ import annotations

import traceback
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .structs import TopicPartition


class KafkaError(Exception):
    """Root of every exception asyncconsumer raises."""

    retriable: ClassVar[bool] = False

    def __reduce__(self) -> tuple[Any, ...]:
        # The message and every attribute as they are, without calling ``__init__`` again (its
        # arguments are not ``self.args``: ``NoOffsetForPartitionError(partitions)``, ...).
        return (_restore, (type(self), self.args), self.__dict__ or None)


def _restore(cls: type[KafkaError], args: tuple[Any, ...]) -> KafkaError:
    """Unpickle a ``KafkaError`` (see ``KafkaError.__reduce__``)."""
    error = cls.__new__(cls)
    error.args = args
    return error


class ConfigError(KafkaError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class ConfigTypeError(ConfigError, TypeError):
    """An option or a call's argument has the wrong type; the message names it.

    Also a ``TypeError`` (and a ``ConfigError``, as before this class existed).
    """


class IllegalStateError(KafkaError):
    """The call does not fit the consumer's state (e.g. not started, no assignment)."""


class ConsumerClosedError(IllegalStateError):
    """The consumer was closed; create a new one."""


class ConcurrentAccessError(IllegalStateError):
    """Two unrelated tasks used the consumer at the same time (see ``Consumer.acquire``)."""


class KafkaTimeoutError(KafkaError, TimeoutError):
    """An operation did not finish within its timeout."""

    retriable = True


class KafkaConnectionError(KafkaError, ConnectionError):
    """A broker could not be reached, or the connection broke."""

    retriable = True


class NoBrokersAvailableError(KafkaConnectionError):
    """None of the bootstrap servers answered."""


class AuthenticationError(KafkaError):
    """TLS or SASL authentication with a broker failed, or the connection's security settings do not
    match the listener (a plaintext client on a SASL listener, say).  Retrying does not help."""


class SaslAuthenticationError(AuthenticationError):
    """The SASL login failed: the broker rejected the credentials or the token (the message names the
    mechanism and the user), the OAUTHBEARER token provider failed, or the exchange broke the rules."""


class TLSHandshakeError(AuthenticationError):
    """The TLS handshake with a broker failed or did not complete: an untrusted certificate, a host name
    the certificate does not cover, the broker refused the client's certificate or its lack of one
    (mutual TLS), or no TLS on that port (the message says which).  The Java client's
    ``SslAuthenticationException``."""


class ProtocolError(KafkaError):
    """A broker sent bytes that do not follow the Kafka protocol."""


class RecordError(KafkaError):
    """A record set could not be decoded; names the partition and offset."""

    def __init__(self, message: str, *, topic: str = "", partition: int = -1, offset: int = -1) -> None:
        where = f" ({topic}-{partition} at offset {offset})" if topic else ""
        super().__init__(message + where)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        #: Where to ``seek()`` to skip the bad data (the offset after its batch), -1 if unknown.
        self.skip_to = -1


class CorruptRecordError(RecordError):
    """A batch failed its CRC check, or its bytes are inconsistent."""


class DecompressionLimitError(CorruptRecordError):
    """A compressed batch decompresses (or says it does) to more than one batch may hold here
    (``max_batch_decompressed_bytes``), or to more than the process could allocate: the data may be
    sound, and a reader with more room could read it."""


class UnsupportedMagicError(RecordError):
    """A batch has a message-format version ('magic') this client cannot read."""


class UnsupportedCodecError(RecordError):
    """A batch uses a compression codec that is unknown or whose library is missing."""


class RecordDeserializationError(RecordError):
    """A key or value deserializer raised (its exception is the ``__cause__``) for the record at
    ``.offset``; ``.field`` is ``"key"`` or ``"value"``.  Handled by the consumer's
    ``on_deserialization_error`` policy: with "raise" (the default) the position stays at that
    record and ``skip_to`` (``offset + 1``) is where to ``seek()`` to skip it."""

    def __init__(
        self, message: str, *, topic: str = "", partition: int = -1, offset: int = -1, field: str = ""
    ) -> None:
        super().__init__(message, topic=topic, partition=partition, offset=offset)
        self.skip_to = offset + 1 if offset >= 0 else -1
        #: Which part of the record could not be deserialized: "key" or "value" ("" if unknown).
        self.field = field


class PyArrowMissingError(KafkaError, ImportError):
    """Arrow output (``arrow_batches()``) needs pyarrow: ``pip install 'asyncconsumer[arrow]'``."""


class CommitFailedError(KafkaError):
    """A commit could not be completed (e.g. the partitions are no longer owned)."""


class PollIntervalExceededError(KafkaError):
    """The application did not poll within ``max_poll_interval_ms``: the member left its group.

    Raised once, by the next poll; the consumer rejoins the group on that poll.
    """

    retriable = True


class RebalanceCallbackError(KafkaError):
    """A rebalance listener callback raised or overran its deadline; the rebalance went on."""


class NoOffsetForPartitionError(KafkaError):
    """No committed offset and ``auto_offset_reset="none"``."""

    def __init__(self, partitions: list[TopicPartition]) -> None:
        names = ", ".join(str(tp) for tp in partitions)
        super().__init__(
            f"no committed offset for {names} and auto_offset_reset='none'; "
            "seek() to a position or set auto_offset_reset"
        )
        self.partitions = partitions


class LogTruncationError(KafkaError):
    """The leader's log diverges before the position (KIP-320) and ``auto_offset_reset="none"``.

    Records at and after ``divergent_offset`` that this consumer read are no longer in the log.
    ``divergent_offset`` is None when the leader could not say where its log diverges.  The
    partition stays stopped until the application seeks it.
    """

    def __init__(
        self, partition: TopicPartition, position: int, divergent_offset: int | None, divergent_epoch: int | None
    ) -> None:
        where = (
            f"the leader's log diverges at offset {divergent_offset} (leader epoch {divergent_epoch})"
            if divergent_offset is not None
            else "the leader has no record of the position's leader epoch"
        )
        super().__init__(
            f"log truncation detected for {partition} at position {position}: {where}; "
            "auto_offset_reset='none': seek() to continue"
        )
        self.partition = partition
        self.position = position
        self.divergent_offset = divergent_offset
        self.divergent_epoch = divergent_epoch


class BrokerResponseError(KafkaError):
    """A broker answered with a non-zero error code."""

    code: ClassVar[int] = -1
    error_name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"

    def __init__(self, message: str | None = None) -> None:
        text = f"[Error {self.code}] {self.error_name}"
        if message:
            text += f": {message}"
        super().__init__(text)
        self.detail = message


class UnknownErrorCodeError(BrokerResponseError):
    """A broker answered with an error code this client does not know (a newer broker)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        KafkaError.__init__(
            self, f"[Error {code}] an error code this client does not know" + (f": {message}" if message else "")
        )
        self.detail = message
        self.unknown_code = code


_BY_CODE: dict[int, type[BrokerResponseError]] = {}


def error_for_code(code: int, message: str | None = None) -> BrokerResponseError:
    """Return an instance of the named class for broker error ``code``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownErrorCodeError(code, message)
    return cls(message)


def error_class(code: int) -> type[BrokerResponseError]:
    return _BY_CODE.get(code, BrokerResponseError)


def clear_frame_locals(error: BaseException) -> None:
    """Drop the locals of the finished frames ``error`` and the exceptions it chains passed through.

    For an error that stays on (a connection's ``_closed_error``, a request's waiter, the
    application's hands): its traceback would keep those frames alive with their locals, a
    response frame or an Arrow column block among them, buffers a pool (engine/buffers.py) could
    not use again.  The traceback's lines stay; frames still running are left as they are.
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        stack += [exc.__cause__, exc.__context__]


from ._broker_errors import *  # noqa: E402,F403
from ._broker_errors import ALL_BROKER_ERRORS, DEPRECATED_NAMES  # noqa: E402

_BY_CODE.update({cls.code: cls for cls in ALL_BROKER_ERRORS})


def __getattr__(name: str) -> type[BrokerResponseError]:
    """The generated classes' old names (``KafkaStorageErrorError``, ...): deprecated aliases."""
    new = DEPRECATED_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"asyncconsumer.errors.{name} is deprecated: use {new}", DeprecationWarning, stacklevel=2)
    cls: type[BrokerResponseError] = globals()[new]
    return cls


class AcknowledgementRequiredError(IllegalStateError):
    """Share consumer, explicit acknowledgement mode: records of the last poll were not acknowledged
    before the next poll (Java's IllegalStateException in the same place)."""


class AcquisitionLockExpiredError(KafkaError):
    """Share consumer: the acquisition lock of the record being acknowledged ran out, so the broker
    has already given it back to the group (another member may be working on it)."""
