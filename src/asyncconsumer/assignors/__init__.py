"""Client-side partition assignors for the classic consumer-group protocol.

``ASSIGNORS`` maps the protocol name a member advertises in JoinGroup to the
assignor class; the names and the bytes they exchange match the Java client
and librdkafka, so groups can mix clients.
"""

from __future__ import annotations

from .base import (
    LATEST_VERSION,
    Assignor,
    MemberAssignment,
    RebalanceProtocol,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    sorted_member_ids,
)
from .range import RangeAssignor
from .roundrobin import RoundRobinAssignor
from .sticky import CooperativeStickyAssignor, StickyAssignor, decode_sticky_user_data, encode_sticky_user_data

__all__ = [
    "ASSIGNORS",
    "LATEST_VERSION",
    "Assignor",
    "CooperativeStickyAssignor",
    "MemberAssignment",
    "RangeAssignor",
    "RebalanceProtocol",
    "RoundRobinAssignor",
    "StickyAssignor",
    "Subscription",
    "decode_assignment",
    "decode_sticky_user_data",
    "decode_subscription",
    "encode_assignment",
    "encode_sticky_user_data",
    "encode_subscription",
    "get_assignor",
    "sorted_member_ids",
]

ASSIGNORS: dict[str, type[Assignor]] = {
    cls.name: cls for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor)
}


def get_assignor(name: str) -> Assignor:
    """A new assignor instance for a protocol name; ``KeyError`` naming the known ones otherwise."""
    try:
        cls = ASSIGNORS[name]
    except KeyError:
        raise KeyError(f"unknown partition assignor {name!r} (known: {', '.join(ASSIGNORS)})") from None
    return cls()
