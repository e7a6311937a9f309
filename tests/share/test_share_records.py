"""The share consumer's records: made without the NamedTuple's own ``__new__``, and the same."""

from __future__ import annotations

from asyncconsumer.app.share_collector import _with
from asyncconsumer.structs import ConsumerRecord, ShareConsumerRecord


def test_a_share_record_has_every_field_of_the_class() -> None:
    raw: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        "t", 3, 42, 1_700_000_000_000, 0, b"k", b"v", 1, 1, (("h", b"x"),), 7
    )
    acquired = ShareConsumerRecord(*raw, delivery_count=2, lock_deadline=123.5)
    got = _with(acquired, "key", {"value": 1})
    assert type(got) is ShareConsumerRecord
    assert len(got) == len(ShareConsumerRecord._fields)  # a field added to the class is made here too
    assert got == ShareConsumerRecord(
        "t", 3, 42, 1_700_000_000_000, 0, "key", {"value": 1}, 1, 1, (("h", b"x"),), 7, 2, 123.5
    )
    assert (got.key, got.delivery_count, got.lock_deadline, got.leader_epoch) == ("key", 2, 123.5, 7)
    assert got.topic_partition == ("t", 3)
