"""examples/share_worker.py on Apache Kafka: jobs accepted, a failing one released until the
group's delivery limit archives it, a bad one rejected, an undecodable one rejected by the
consumer (once: it is not delivered again) and counted."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.share import share_group

pytestmark = [pytest.mark.timeout(120), pytest.mark.broker_feature("share_groups")]


@pytest.fixture(scope="module")
def bootstrap(apache_kafka: Any) -> str:
    return str(apache_kafka.bootstrap)


def test_share_worker_acknowledges_each_job(
    bootstrap: str, new_topic: Callable[..., str], produce: Callable[..., Any]
) -> None:
    from fastapi.testclient import TestClient

    from examples.share_worker import create_app

    topic = new_topic(2)
    group = share_group(bootstrap, share_delivery_count_limit=2, share_record_lock_duration_ms=3000)
    jobs = [json.dumps({"n": i}).encode() for i in range(20)]
    jobs += [json.dumps({"fail": "retriable"}).encode(), json.dumps({"fail": "permanent"}).encode(), b"not json"]
    produce(topic, [(i % 2, None, job) for i, job in enumerate(jobs)])
    with TestClient(create_app(bootstrap, topic, group)) as client:
        want = {"done": 20, "released": 2, "rejected": 1, "undecodable": 1, "in_progress": 0}
        deadline = time.monotonic() + 60
        while client.get("/stats").json() != want:
            assert time.monotonic() < deadline, client.get("/stats").json()
            time.sleep(0.2)
        time.sleep(1.0)  # and nothing more comes
        assert client.get("/stats").json() == want
