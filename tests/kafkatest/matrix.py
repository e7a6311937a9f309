"""Which scenarios CI runs (``./dev kafkatest -m kafkatest_ci``); conftest.py marks them."""

from __future__ import annotations

from pathlib import Path

import pytest

#: CI's subset (``./dev kafkatest -m kafkatest_ci``, about 10 minutes on two cores): one scenario of
#: each kind on both group protocols with asyncconsumer on asyncio, two share-group scenarios, and
#: one Java case, which checks the driver itself.  ``module::test[parameters]`` (the id without the
#: client) -> the clients it runs with there.
CI_SUBSET: dict[str, tuple[str, ...]] = {
    "test_consumer.py::test_group_consumption[classic-batching]": ("java", "asyncconsumer-asyncio"),
    "test_consumer.py::test_group_consumption[consumer-batching]": ("asyncconsumer-asyncio",),
    "test_consumer.py::test_consumer_failure[manualcommit-classic-batching-clean]": ("asyncconsumer-asyncio",),
    "test_consumer.py::test_consumer_failure[manualcommit-consumer-batching-clean]": ("asyncconsumer-asyncio",),
    "test_consumer.py::test_broker_failure[classic-manualcommit-sigkill]": ("asyncconsumer-asyncio",),
    "test_assignment.py::test_valid_assignment[classic-CooperativeStickyAssignor]": ("asyncconsumer-asyncio",),
    "test_assignment.py::test_valid_assignment[consumer-uniform-batching]": ("asyncconsumer-asyncio",),
    "test_share_consumer.py::test_share_consumer_failure[1consumer-sigkill-batching]": ("asyncconsumer-asyncio",),
    # found the share consumer raising NOT_LEADER_OR_FOLLOWER from poll while brokers restart
    "test_share_consumer.py::test_broker_rolling_bounce[clean-batching]": ("asyncconsumer-asyncio",),
}


def ci_key(item: pytest.Item) -> tuple[str, str]:
    """(``module::test[parameters without the client]``, client) of a scenario."""
    callspec = getattr(item, "callspec", None)
    client = str(callspec.params.get("client", "")) if callspec else ""
    name = item.name.replace(f"[{client}-", "[", 1).replace(f"[{client}]", "") if client else item.name
    return f"{Path(str(item.fspath)).name}::{name}", client
