"""The machine's limit: librdkafka's C consumer through ``kcat``, doing no per-record work.

``kcat -C -b BOOTSTRAP -t TOPIC -o beginning -e -f ''`` reads every partition from the beginning and
exits at the end of the last one (``-e``); the empty format prints nothing per record (stdout goes to
/dev/null anyway), so the process is librdkafka's fetching and its batch parsing, in C, with
librdkafka's defaults.  kcat prints "Reached end of topic T [p] at offset N" on stderr per
partition: the offsets are checked to add up to the records expected (a read that fell short is an
error, not a fast row).  Wall time is the whole process (start-up and connecting included: a few
ms), CPU its own (``wait4``, all threads), peak RSS its VmHWM sampled from /proc.

Debian and Ubuntu package it as ``kcat`` (``apt-get install kcat``); without it the row says so.
The other reference, a Fetch loop of ours that decodes nothing, is the ``asyncconsumer-fetch-only``
client (benchmarks/clients.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any

from .datasets import Dataset
from .java import SAMPLE_S, ProcessSampler

CLIENT = "kcat"
LABEL = "kcat (librdkafka's C consumer, no output; ceiling)"
_END = re.compile(r"Reached end of topic (\S+) \[(\d+)\] at offset (\d+)")


def missing() -> str | None:
    """Why the kcat row cannot run here, or None."""
    if shutil.which("kcat") is None:
        return "kcat is not installed (Debian/Ubuntu: apt-get install kcat): no C ceiling in this run"
    return None


def version() -> str:
    out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=30, check=False).stdout
    match = re.search(r"librdkafka version ([\w.\-]+)", out)
    return f"kcat, librdkafka {match.group(1)}" if match else "kcat"


def run(bootstrap: str, dataset: Dataset, timeout: float) -> dict[str, Any]:
    """One read of ``dataset`` by kcat; a result like the Python readers' (``records`` from the
    end offsets kcat reports, ``payload_kind`` "none": kcat reports no bytes)."""
    result: dict[str, Any] = {"client": CLIENT, "topic": dataset.topic, "expected": dataset.records,
                              "first_record_s": None, "error": missing(), "payload_kind": "none"}
    if result["error"]:
        return result
    command = ["kcat", "-C", "-b", bootstrap, "-t", dataset.topic, "-o", "beginning", "-e", "-f", "",
               "-X", "log_level=3"]
    with tempfile.TemporaryFile("w+") as err, open(os.devnull, "w") as null:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=null, stderr=err, stdin=subprocess.DEVNULL)
        sampler = ProcessSampler(proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()  # this kcat only, by its own pid
                os.waitpid(proc.pid, 0)
                result["error"] = f"timed out after {timeout:.0f}s"
                return result
            sampler.sample()
            time.sleep(SAMPLE_S)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    ends = {int(p): int(offset) for topic, p, offset in _END.findall(stderr) if topic == dataset.topic}
    records = sum(ends.values())
    code = os.waitstatus_to_exitcode(status)
    result.update(
        records=records, payload_bytes=None, wall_s=wall, records_per_s=records / wall if wall > 0 else 0.0,
        mb_per_s=dataset.payload_bytes / wall / 1e6 if wall > 0 and records == dataset.records else 0.0,
        cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_mb=sampler.peak_rss_mb, version=version(),
    )
    if code != 0:
        result["error"] = f"kcat exit {code}: {stderr.strip()[-300:]}"
    elif len(ends) != dataset.partitions or records != dataset.records:
        result["error"] = f"kcat reported end offsets {ends}, not {dataset.records} records"
    result["ok"] = not result["error"]
    return result
