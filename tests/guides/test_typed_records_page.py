"""docs/typed-records.md's "try it" path runs as written: ``write_customers.py`` (confluent-kafka's
Avro serializer through the registry) and then the page's Avro consumer print the names.  The
session's registry (Apicurio, the ``schema_registry`` fixture) stands in for ``registry.py``, which
is the same class; the page's addresses are replaced by the session's.  On Apache Kafka: the page's
consumer is in a group, whose first join takes 23 s on the embedded broker."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.paths import ROOT

from asyncconsumer.testing import SchemaRegistry

pytestmark = pytest.mark.broker
pytest_plugins = ["support.registry_fixtures"]

PAGE = ROOT / "docs" / "typed-records.md"


def python_block(containing: str) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if containing in b]
    return block


def test_the_page_writes_and_reads_avro_customers(apache_kafka: Any, registry: SchemaRegistry,
                                                  tmp_path: Path) -> None:
    bootstrap = apache_kafka.bootstrap
    registry_block = python_block("SchemaRegistry() as registry")
    assert "input(" in registry_block  # runs until Enter; the session's registry is this same class
    writer = python_block("AvroSerializer(").replace("127.0.0.1:9092", bootstrap)
    reader = python_block("AvroDeserializer(registry)").replace("127.0.0.1:9092", bootstrap)
    reader = reader.replace('"http://127.0.0.1:8081"', repr(registry.url))
    (tmp_path / "write_customers.py").write_text(writer)
    done = subprocess.run([sys.executable, "write_customers.py", registry.url], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # The consumer reads "for as long as it runs": stop it once it printed the three names.
    proc = subprocess.Popen([sys.executable, "-c", reader], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while len(printed) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            printed.append(line.split(" ", 1)[1].strip())
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert sorted(printed) == ["Ada", "Grace", "Linus"], (printed, err)
