"""Share-group helpers for tests: group configs (IncrementalAlterConfigs on the GROUP resource)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource


def share_group(bootstrap: str, *, prefix: str = "share", **configs: object) -> str:
    """A new share group name whose ``share.auto.offset.reset`` is ``earliest``, with ``configs``
    (``share_record_lock_duration_ms=2000`` sets ``share.record.lock.duration.ms``) set as well."""
    group = f"{prefix}-{uuid.uuid4().hex[:10]}"
    set_share_group_config(bootstrap, group, **{"share_auto_offset_reset": "earliest", **configs})
    return group


def set_share_group_config(bootstrap: str, group: str, **configs: object) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    entries = [
        ConfigEntry(name.replace("_", "."), str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource("GROUP", group, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


@pytest.fixture(scope="module", name="bootstrap")
def apache_kafka_bootstrap(apache_kafka: Any) -> str:
    """``bootstrap`` for a share-group module: Apache Kafka (Tansu has no share groups), so that
    ``new_topic``/``produce`` use it too.  Import it into the module to override the suite's."""
    return str(apache_kafka.bootstrap)
