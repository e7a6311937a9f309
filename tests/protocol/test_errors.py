"""Broker error codes map to named classes with Kafka's retriable flags (Apache Kafka's ``Errors``)."""

from __future__ import annotations

import subprocess
import warnings
from typing import Any

import pytest
from support.paths import tool

from asyncconsumer import KafkaError, errors
from asyncconsumer.errors import BrokerResponseError, UnknownErrorCodeError, error_for_code

# (code, class name, retriable) as in Apache Kafka's org.apache.kafka.common.protocol.Errors.
KNOWN = [
    (1, "OffsetOutOfRangeError", False),
    (2, "CorruptMessageError", True),
    (3, "UnknownTopicOrPartitionError", True),
    (5, "LeaderNotAvailableError", True),
    (6, "NotLeaderOrFollowerError", True),
    (7, "RequestTimedOutError", True),
    (14, "CoordinatorLoadInProgressError", True),
    (15, "CoordinatorNotAvailableError", True),
    (16, "NotCoordinatorError", True),
    (22, "IllegalGenerationError", False),
    (25, "UnknownMemberIdError", False),
    (27, "RebalanceInProgressError", False),
    (29, "TopicAuthorizationFailedError", False),
    (30, "GroupAuthorizationFailedError", False),
    (35, "UnsupportedVersionError", False),
    (58, "SaslAuthenticationFailedError", False),
    (70, "FetchSessionIdNotFoundError", True),
    (74, "FencedLeaderEpochError", True),
    (75, "UnknownLeaderEpochError", True),
    (79, "MemberIdRequiredError", False),
    (81, "GroupMaxSizeReachedError", False),
    (82, "FencedInstanceIdError", False),
    (110, "FencedMemberEpochError", False),
]


@pytest.mark.parametrize(("code", "name", "retriable"), KNOWN)
def test_codes_map_to_named_classes(code: int, name: str, retriable: bool) -> None:
    error = error_for_code(code, "while doing something")
    assert type(error) is getattr(errors, name)
    assert isinstance(error, BrokerResponseError) and isinstance(error, KafkaError)
    assert error.code == code and error.retriable is retriable
    assert str(error).startswith(f"[Error {code}] ") and str(error).endswith(": while doing something")


def test_every_code_is_one_class() -> None:
    codes = [cls.code for cls in errors.ALL_BROKER_ERRORS]
    assert len(codes) == len(set(codes)) and len(codes) > 100


def test_an_unknown_code_says_which() -> None:
    error = error_for_code(9999, "Fetch from node 1")
    assert isinstance(error, UnknownErrorCodeError) and isinstance(error, BrokerResponseError)
    assert error.unknown_code == 9999 and not error.retriable
    assert str(error) == "[Error 9999] an error code this client does not know: Fetch from node 1"


#: Prints every error of the Java client's table: code, name, and whether its exception is retriable.
_JAVA_ERRORS = """
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.protocol.Errors;

public class ErrorTable {
    public static void main(String[] args) {
        for (Errors error : Errors.values()) {
            boolean retriable = error.exception() instanceof RetriableException;
            System.out.println(error.code() + " " + error.name() + " " + retriable);
        }
    }
}
"""


@pytest.mark.kafka_jvm
def test_the_table_is_the_java_clients(tmp_path: Any) -> None:
    """Every code Apache Kafka's Java client knows (the reference release's kafka-clients jar, run
    with its own ``Errors.values()``) has a class here, with its name and Java's retriable verdict."""
    from asyncconsumer.testing.kafka import JavaNotFoundError, KafkaDownloadError, find_java, kafka_libs

    try:
        java, _ = find_java()
        libs = kafka_libs()
    except (JavaNotFoundError, KafkaDownloadError) as exc:
        pytest.skip(str(exc))
    source = tmp_path / "ErrorTable.java"
    source.write_text(_JAVA_ERRORS)
    result = subprocess.run([java, "-cp", str(libs / "*"), str(source)], capture_output=True, text=True,
                            timeout=120, check=True)
    java_table = {}
    for line in result.stdout.split("\n"):
        if line.strip():
            code, name, retriable = line.split()
            java_table[int(code)] = (name, retriable == "true")
    assert len(java_table) > 130
    ours = {cls.code: (cls.error_name, cls.retriable) for cls in errors.ALL_BROKER_ERRORS}
    java_table.pop(0)  # NONE: no error
    assert ours == java_table


def _generator() -> Any:
    return tool("gen_errors")


def test_the_generated_module_is_what_the_generator_writes() -> None:
    """Edit tools/gen_errors.py, then run it: the two never drift apart."""
    generator = _generator()
    assert generator.OUTPUT.read_text() == generator.render()


@pytest.mark.parametrize(
    ("code", "name"),
    [(-1, "UnknownServerError"), (13, "NetworkError"), (17, "InvalidTopicError"), (56, "KafkaStorageError"),
     (106, "FetchSessionTopicIdError")],
)
def test_a_name_ending_in_error_or_exception_says_error_once(code: int, name: str) -> None:
    assert errors.error_class(code) is getattr(errors, name)
    doubled = [c.__name__ for c in errors.ALL_BROKER_ERRORS if c.__name__.endswith(("ErrorError", "ExceptionError"))]
    assert doubled == []


@pytest.mark.parametrize(
    ("old", "new"),
    [("UnknownServerErrorError", "UnknownServerError"), ("NetworkExceptionError", "NetworkError"),
     ("InvalidTopicExceptionError", "InvalidTopicError"), ("KafkaStorageErrorError", "KafkaStorageError"),
     ("FetchSessionTopicIdErrorError", "FetchSessionTopicIdError")],
)
def test_the_old_doubled_names_still_work_with_a_deprecation_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"asyncconsumer.errors.{old} is deprecated: use {new}"):
        assert getattr(errors, old) is getattr(errors, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(errors, new)  # the new name does not warn
    with pytest.raises(AttributeError, match="NoSuchError"):
        errors.NoSuchError  # noqa: B018


def test_the_code_sets_name_their_codes() -> None:
    assert {errors.error_class(c).error_name for c in errors.COORDINATOR_CODES} == {
        "NETWORK_EXCEPTION", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}
    assert {errors.error_class(c).error_name for c in errors.SHARE_SESSION_CODES} == {
        "SHARE_SESSION_NOT_FOUND", "INVALID_SHARE_SESSION_EPOCH"}
    assert {errors.error_class(c).error_name for c in errors.MEMBER_FATAL_CODES} == {
        "FENCED_INSTANCE_ID", "GROUP_MAX_SIZE_REACHED"}


def _public_exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class a user imports: ``asyncconsumer.errors``' and the package root's."""
    import asyncconsumer

    found = {}
    for module in (errors, asyncconsumer):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found[name] = value
    return found


def test_public_exceptions_say_their_public_module() -> None:
    """Tracebacks show ``asyncconsumer.errors.X``, not a private module (``_broker_errors``,
    ``app.collector``) the user cannot import from."""
    import traceback

    import asyncconsumer

    classes = _public_exception_classes()
    assert {"UnknownTopicOrPartitionError", "RecordDeserializationError", "PyArrowMissingError"} <= set(classes)
    wrong = {name: cls.__module__ for name, cls in classes.items() if cls.__module__ != "asyncconsumer.errors"}
    assert wrong == {}
    assert asyncconsumer.RecordDeserializationError is errors.RecordDeserializationError
    line = traceback.format_exception_only(error_for_code(3, "topic 'orders'"))[-1]
    assert line == "asyncconsumer.errors.UnknownTopicOrPartitionError: [Error 3] UNKNOWN_TOPIC_OR_PARTITION: " \
                   "topic 'orders'\n"


def _examples() -> list[KafkaError]:
    from asyncconsumer import RecordDeserializationError, TopicPartition

    tp = TopicPartition("orders", 3)
    bad = RecordDeserializationError("value_deserializer raised ValueError", topic="orders", partition=3,
                                            offset=12)
    corrupt = errors.CorruptRecordError("CRC mismatch", topic="orders", partition=3, offset=40)
    corrupt.skip_to = 45
    return [
        error_for_code(3, "topic 'orders'"),
        UnknownErrorCodeError(9999, "Fetch from node 1"),
        errors.NoOffsetForPartitionError([tp]),
        errors.LogTruncationError(tp, 120, 100, 4),
        bad,
        corrupt,
        errors.ConfigTypeError("getmany(): timeout must be a number of seconds or None, got '1'"),
        errors.ConsumerClosedError("the consumer is closed"),
        errors.KafkaTimeoutError("metadata request did not complete within 1.0s"),
    ]


@pytest.mark.parametrize("error", _examples(), ids=lambda e: type(e).__name__)
def test_errors_pickle_with_their_message_and_attributes(error: KafkaError) -> None:
    """Across processes (multiprocessing, a Spark executor) an error stays what it was."""
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)
