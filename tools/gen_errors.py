"""Generate src/asyncconsumer/_broker_errors.py from Kafka's error-code table.

The table below is the public list of Kafka protocol error codes (code, name,
retriable), as Apache Kafka 4.4.0's ``org.apache.kafka.common.protocol.Errors``
has them: "retriable" is whether the Java client's exception for the code is a
``RetriableException`` (checked by running ``Errors.values()`` of kafka-clients
4.4.0); ``CODE_SETS`` names the sets of codes the request managers act on
alike, one set per meaning (``errors.COORDINATOR_CODES``, ...), so no module
keeps its own copy of the numbers.  Run ``python tools/gen_errors.py`` after
editing either (tests/protocol/test_errors.py fails while the generated file is out of date).
"""

from __future__ import annotations

import pathlib

R, F = True, False
TABLE = [
    (-1, "UNKNOWN_SERVER_ERROR", F),
    (1, "OFFSET_OUT_OF_RANGE", F),
    (2, "CORRUPT_MESSAGE", R),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", R),
    (4, "INVALID_FETCH_SIZE", F),
    (5, "LEADER_NOT_AVAILABLE", R),
    (6, "NOT_LEADER_OR_FOLLOWER", R),
    (7, "REQUEST_TIMED_OUT", R),
    (8, "BROKER_NOT_AVAILABLE", F),
    (9, "REPLICA_NOT_AVAILABLE", R),
    (10, "MESSAGE_TOO_LARGE", F),
    (11, "STALE_CONTROLLER_EPOCH", F),
    (12, "OFFSET_METADATA_TOO_LARGE", F),
    (13, "NETWORK_EXCEPTION", R),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", R),
    (15, "COORDINATOR_NOT_AVAILABLE", R),
    (16, "NOT_COORDINATOR", R),
    (17, "INVALID_TOPIC_EXCEPTION", F),
    (18, "RECORD_LIST_TOO_LARGE", F),
    (19, "NOT_ENOUGH_REPLICAS", R),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", R),
    (21, "INVALID_REQUIRED_ACKS", F),
    (22, "ILLEGAL_GENERATION", F),
    (23, "INCONSISTENT_GROUP_PROTOCOL", F),
    (24, "INVALID_GROUP_ID", F),
    (25, "UNKNOWN_MEMBER_ID", F),
    (26, "INVALID_SESSION_TIMEOUT", F),
    (27, "REBALANCE_IN_PROGRESS", F),
    (28, "INVALID_COMMIT_OFFSET_SIZE", F),
    (29, "TOPIC_AUTHORIZATION_FAILED", F),
    (30, "GROUP_AUTHORIZATION_FAILED", F),
    (31, "CLUSTER_AUTHORIZATION_FAILED", F),
    (32, "INVALID_TIMESTAMP", F),
    (33, "UNSUPPORTED_SASL_MECHANISM", F),
    (34, "ILLEGAL_SASL_STATE", F),
    (35, "UNSUPPORTED_VERSION", F),
    (36, "TOPIC_ALREADY_EXISTS", F),
    (37, "INVALID_PARTITIONS", F),
    (38, "INVALID_REPLICATION_FACTOR", F),
    (39, "INVALID_REPLICA_ASSIGNMENT", F),
    (40, "INVALID_CONFIG", F),
    (41, "NOT_CONTROLLER", R),
    (42, "INVALID_REQUEST", F),
    (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", F),
    (44, "POLICY_VIOLATION", F),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", F),
    (46, "DUPLICATE_SEQUENCE_NUMBER", F),
    (47, "INVALID_PRODUCER_EPOCH", F),
    (48, "INVALID_TXN_STATE", F),
    (49, "INVALID_PRODUCER_ID_MAPPING", F),
    (50, "INVALID_TRANSACTION_TIMEOUT", F),
    (51, "CONCURRENT_TRANSACTIONS", R),
    (52, "TRANSACTION_COORDINATOR_FENCED", F),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", F),
    (54, "SECURITY_DISABLED", F),
    (55, "OPERATION_NOT_ATTEMPTED", F),
    (56, "KAFKA_STORAGE_ERROR", R),
    (57, "LOG_DIR_NOT_FOUND", F),
    (58, "SASL_AUTHENTICATION_FAILED", F),
    (59, "UNKNOWN_PRODUCER_ID", F),
    (60, "REASSIGNMENT_IN_PROGRESS", F),
    (61, "DELEGATION_TOKEN_AUTH_DISABLED", F),
    (62, "DELEGATION_TOKEN_NOT_FOUND", F),
    (63, "DELEGATION_TOKEN_OWNER_MISMATCH", F),
    (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", F),
    (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", F),
    (66, "DELEGATION_TOKEN_EXPIRED", F),
    (67, "INVALID_PRINCIPAL_TYPE", F),
    (68, "NON_EMPTY_GROUP", F),
    (69, "GROUP_ID_NOT_FOUND", F),
    (70, "FETCH_SESSION_ID_NOT_FOUND", R),
    (71, "INVALID_FETCH_SESSION_EPOCH", R),
    (72, "LISTENER_NOT_FOUND", R),
    (73, "TOPIC_DELETION_DISABLED", F),
    (74, "FENCED_LEADER_EPOCH", R),
    (75, "UNKNOWN_LEADER_EPOCH", R),
    (76, "UNSUPPORTED_COMPRESSION_TYPE", F),
    (77, "STALE_BROKER_EPOCH", F),
    (78, "OFFSET_NOT_AVAILABLE", R),
    (79, "MEMBER_ID_REQUIRED", F),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", R),
    (81, "GROUP_MAX_SIZE_REACHED", F),
    (82, "FENCED_INSTANCE_ID", F),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", R),
    (84, "ELECTION_NOT_NEEDED", R),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", F),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", F),
    (87, "INVALID_RECORD", F),
    (88, "UNSTABLE_OFFSET_COMMIT", R),
    (89, "THROTTLING_QUOTA_EXCEEDED", R),
    (90, "PRODUCER_FENCED", F),
    (91, "RESOURCE_NOT_FOUND", F),
    (92, "DUPLICATE_RESOURCE", F),
    (93, "UNACCEPTABLE_CREDENTIAL", F),
    (94, "INCONSISTENT_VOTER_SET", F),
    (95, "INVALID_UPDATE_VERSION", F),
    (96, "FEATURE_UPDATE_FAILED", F),
    (97, "PRINCIPAL_DESERIALIZATION_FAILURE", F),
    (98, "SNAPSHOT_NOT_FOUND", F),
    (99, "POSITION_OUT_OF_RANGE", F),
    (100, "UNKNOWN_TOPIC_ID", R),
    (101, "DUPLICATE_BROKER_REGISTRATION", F),
    (102, "BROKER_ID_NOT_REGISTERED", F),
    (103, "INCONSISTENT_TOPIC_ID", R),
    (104, "INCONSISTENT_CLUSTER_ID", F),
    (105, "TRANSACTIONAL_ID_NOT_FOUND", F),
    (106, "FETCH_SESSION_TOPIC_ID_ERROR", R),
    (107, "INELIGIBLE_REPLICA", F),
    (108, "NEW_LEADER_ELECTED", F),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", F),
    (110, "FENCED_MEMBER_EPOCH", F),
    (111, "UNRELEASED_INSTANCE_ID", F),
    (112, "UNSUPPORTED_ASSIGNOR", F),
    (113, "STALE_MEMBER_EPOCH", F),
    (114, "MISMATCHED_ENDPOINT_TYPE", F),
    (115, "UNSUPPORTED_ENDPOINT_TYPE", F),
    (116, "UNKNOWN_CONTROLLER_ID", F),
    (117, "UNKNOWN_SUBSCRIPTION_ID", F),
    (118, "TELEMETRY_TOO_LARGE", F),
    (119, "INVALID_REGISTRATION", F),
    (120, "TRANSACTION_ABORTABLE", F),
    (121, "INVALID_RECORD_STATE", F),
    (122, "SHARE_SESSION_NOT_FOUND", R),
    (123, "INVALID_SHARE_SESSION_EPOCH", R),
    (124, "FENCED_STATE_EPOCH", F),
    (125, "INVALID_VOTER_KEY", F),
    (126, "DUPLICATE_VOTER", F),
    (127, "VOTER_NOT_FOUND", F),
    (128, "INVALID_REGULAR_EXPRESSION", F),
    (129, "REBOOTSTRAP_REQUIRED", F),
    (130, "STREAMS_INVALID_TOPOLOGY", F),
    (131, "STREAMS_INVALID_TOPOLOGY_EPOCH", F),
    (132, "STREAMS_TOPOLOGY_FENCED", F),
    (133, "SHARE_SESSION_LIMIT_REACHED", R),
    (134, "GROUP_DELETION_FAILED", F),
    (135, "STREAMS_TOPOLOGY_DESCRIPTION_UPDATE_FAILED", F),
    (136, "CONTROLLER_ID_NOT_REGISTERED", F),
]

#: name -> (what the codes have in common and what a manager does about them, the codes by name).
CODE_SETS: dict[str, tuple[str, list[str]]] = {
    "COORDINATOR_CODES": (
        "The group coordinator moved, is loading or cannot be reached: look it up again and retry.",
        ["NETWORK_EXCEPTION", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"],
    ),
    "REFRESH_METADATA_CODES": (
        "Partition errors that a metadata refresh (a new leader, a new epoch, the topic's id) can fix:\n"
        "refresh, then retry (Fetch, ListOffsets, OffsetForLeaderEpoch; the topic-id codes come from\n"
        "Fetch only and are harmless in the others).",
        [
            "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE", "NOT_LEADER_OR_FOLLOWER", "REPLICA_NOT_AVAILABLE",
            "KAFKA_STORAGE_ERROR", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE",
            "UNKNOWN_TOPIC_ID", "INCONSISTENT_TOPIC_ID", "FETCH_SESSION_TOPIC_ID_ERROR",
        ],
    ),
    "RETRY_LATER_CODES": (
        "A passing condition on the broker: send the same request again after the backoff\n"
        "(OffsetCommit, OffsetFetch).",
        ["REQUEST_TIMED_OUT", "UNSTABLE_OFFSET_COMMIT", "THROTTLING_QUOTA_EXCEEDED"],
    ),
    "FETCH_SESSION_CODES": (
        "The broker forgot the incremental fetch session (KIP-227): start a new one with a full fetch.",
        ["FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH"],
    ),
    "MEMBER_FATAL_CODES": (
        "This member cannot go on in its group: another consumer joined with its group_instance_id\n"
        "(KIP-345), or the group is full.  Final: the partitions are lost and the application told.",
        ["GROUP_MAX_SIZE_REACHED", "FENCED_INSTANCE_ID"],
    ),
    "SHARE_SESSION_CODES": (
        "The broker forgot the share session (KIP-932): open a new one with epoch 0.",
        ["SHARE_SESSION_NOT_FOUND", "INVALID_SHARE_SESSION_EPOCH"],
    ),
}


def class_name(name: str) -> str:
    """``KAFKA_STORAGE_ERROR`` -> ``KafkaStorageError``: a trailing ERROR or EXCEPTION goes before
    ``Error`` is added (``NETWORK_EXCEPTION`` -> ``NetworkError``), so no name says it twice."""
    parts = name.split("_")
    if len(parts) > 1 and parts[-1] in ("ERROR", "EXCEPTION"):
        parts = parts[:-1]
    return "".join(part.capitalize() for part in parts) + "Error"


def old_class_name(name: str) -> str:
    """The name the generator gave before it dropped the doubled word (kept as a deprecated alias)."""
    return "".join(part.capitalize() for part in name.split("_")) + "Error"


OUTPUT = pathlib.Path(__file__).parent.parent / "src/asyncconsumer/_broker_errors.py"


def render() -> str:
    """The text of ``_broker_errors.py``."""
    out = [
        '"""Generated by tools/gen_errors.py: one class per Kafka protocol error code.',
        "",
        "Users import them from ``asyncconsumer.errors``, and that is the module each says it is in",
        "(``__module__``): tracebacks and pickle name ``asyncconsumer.errors.<class>``.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from .errors import BrokerResponseError",
        "",
    ]
    for code, name, retriable in TABLE:
        out += [
            "",
            f"class {class_name(name)}(BrokerResponseError):",
            '    __module__ = "asyncconsumer.errors"',
            f"    code = {code}",
            f'    error_name = "{name}"',
            f"    retriable = {retriable}",
            "",
        ]
    names = ", ".join(class_name(n) for _, n, _ in TABLE)
    out += ["", f"ALL_BROKER_ERRORS: tuple[type[BrokerResponseError], ...] = ({names},)", ""]
    renamed = [(old_class_name(n), class_name(n)) for _, n, _ in TABLE if old_class_name(n) != class_name(n)]
    out += [
        "",
        "#: Names the classes had before the generator dropped a doubled word (``KafkaStorageErrorError``):",
        "#: ``errors`` still answers to them, with a DeprecationWarning.",
        "DEPRECATED_NAMES: dict[str, str] = {",
        *(f'    "{old}": "{new}",' for old, new in renamed),
        "}",
        "",
    ]
    codes = {name: code for code, name, _ in TABLE}
    for set_name, (doc, members) in CODE_SETS.items():
        numbers = ", ".join(str(codes[m]) for m in members)  # KeyError: a name not in TABLE
        out += [""] + [f"#: {line}" for line in doc.splitlines()] + [f"#: {', '.join(members)}."]
        out += [f"{set_name}: frozenset[int] = frozenset({{{numbers}}})"]
    out += [""]
    return "\n".join(out)


def main() -> None:
    OUTPUT.write_text(render())


if __name__ == "__main__":
    main()
