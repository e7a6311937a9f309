"""Authorization errors against Apache Kafka with an authorizer: typed, at once, as in the Java client.

The broker runs KRaft's ``StandardAuthorizer`` with no ACLs: PLAINTEXT clients (``ANONYMOUS``,
a super user here) create and fill the topic; ``alice``, over SASL, may do nothing.  The Java
consumer then throws ``TopicAuthorizationException`` from ``poll()`` for a topic it may not read,
and ``GroupAuthorizationException`` from ``poll()``, ``committed()`` and ``commitSync()`` for a
group it may not use (the group coordinator lookup answers GROUP_AUTHORIZATION_FAILED); neither is
retriable.  This consumer raises the same errors as quickly, and ``close()`` does not wait for a
coordinator it never had.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from support.broker import private_kafka
from support.producer import create_topic, produce

from asyncconsumer import Consumer, TopicPartition
from asyncconsumer.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from asyncconsumer.testing import KafkaBroker

pytestmark = [pytest.mark.anyio, pytest.mark.broker, pytest.mark.kafka_jvm]

#: Each error must come well within this (nothing waits for a timeout to say what is wrong).
PROMPT = 3.0


@pytest.fixture(scope="module")
def acl_broker() -> Iterator[KafkaBroker]:
    with private_kafka(listeners=("PLAINTEXT", "SASL_PLAINTEXT"), config={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
    }) as broker:
        yield broker


@pytest.fixture(scope="module")
def topic(acl_broker: KafkaBroker) -> str:
    name = create_topic(acl_broker.bootstrap, f"acl-{uuid.uuid4().hex[:10]}", 1)
    produce(acl_broker.bootstrap, name, [b"a", b"b", b"c"])
    return name


def alice(broker: KafkaBroker, **options: Any) -> Consumer[bytes, bytes]:
    return Consumer(**broker.consumer_options("SASL_PLAINTEXT", mechanism="PLAIN", user="alice"),
                    auto_offset_reset="earliest", **options)


async def test_a_topic_without_read_acl(acl_broker: KafkaBroker, topic: str, anyio_backend: str) -> None:
    started = time.monotonic()
    async with alice(acl_broker) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(TopicAuthorizationFailedError, match=topic), anyio.fail_after(10):
            await consumer.getmany(timeout=10)
        with pytest.raises(TopicAuthorizationFailedError), anyio.fail_after(10):
            await consumer.end_offsets([TopicPartition(topic, 0)])
    assert time.monotonic() - started < PROMPT


async def test_a_group_without_acl_fails_every_group_call_at_once(
    acl_broker: KafkaBroker, topic: str, anyio_backend: str
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    async with alice(acl_broker, group_id=group) as consumer:
        consumer.subscribe([topic])
        for _ in range(2):  # not only once: every poll says it, as long as it lasts
            with pytest.raises(GroupAuthorizationFailedError), anyio.fail_after(10):
                await consumer.getmany(timeout=10)
        closing = time.monotonic()
    assert time.monotonic() - closing < 1.0, "close() waited for a coordinator it never had"
    tp = TopicPartition(topic, 0)
    async with alice(acl_broker, group_id=group, enable_auto_commit=False) as consumer:
        consumer.assign([tp])  # offsets only: no membership
        with pytest.raises(GroupAuthorizationFailedError), anyio.fail_after(10):
            await consumer.committed({tp})
        with pytest.raises(GroupAuthorizationFailedError), anyio.fail_after(10):
            await consumer.commit({tp: 1})
    assert time.monotonic() - started < 2 * PROMPT
