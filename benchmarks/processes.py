"""Running a benchmark's readers in processes of their own, and the driver's log.

Every reader runs in a fresh subprocess (``python -m benchmarks.clients CLIENT ...``, Java's
consumer from Apache Kafka's jars, or franz-go's reader built from benchmarks/go/franz) that prints
one JSON object as its last line; :func:`run_client` runs one and checks that it read every record
and every byte.  Used by benchmarks/run.py, benchmarks/steady.py and benchmarks/ab.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import brokers, franz
from . import datasets as ds
from . import java as java_client
from .clients import CLIENT_ENV

ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def client_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment with ``extra``, and the repository first on ``PYTHONPATH`` (``benchmarks`` importable)."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_json(command: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run a benchmark subprocess that prints one JSON object as its last stdout line."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}, no result; stderr: {proc.stderr.strip()[-400:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def module_command(module: str, *positional: str, **options: object) -> list[str]:
    """``python -m module positional... --option value...`` (underscores in names become dashes)."""
    command = [sys.executable, "-m", module, *positional]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def run_client(
    client: str, dataset: ds.Dataset, broker: brokers.Broker, timeout: float, count: int | None = None
) -> dict[str, Any]:
    """One client's read of ``dataset`` (``count`` records, default all) in a process of its own.

    ``ok``: no error, every record read, and the keys and values add up to the data set's bytes.
    """
    want = count or dataset.records
    if client == java_client.CLIENT:
        result = java_client.run(broker.handle, dataset, want, timeout)
    elif client == franz.CLIENT:
        result = franz.run(broker.bootstrap, dataset, timeout, want)
    else:
        command = module_command("benchmarks.clients", client, bootstrap=broker.bootstrap, topic=dataset.topic,
                                 partitions=dataset.partitions, count=want)
        result = run_json(command, timeout, client_env(CLIENT_ENV.get(client, {})))
    result.setdefault("client", client)
    result["dataset"] = dataset.name
    if not result.get("error"):
        payload = want * (ds.KEY_SIZE + dataset.value_size)
        if result.get("records") != want:
            result["error"] = f"read {result.get('records')} of {want} records"
        elif result.get("payload_kind", "kv") == "kv" and (
            abs(result.get("payload_bytes", -1) - payload) > result.get("payload_tolerance", 0)
        ):
            result["error"] = f"read {result.get('payload_bytes')} bytes of keys and values, not {payload}"
    result["ok"] = not result.get("error")
    return result


