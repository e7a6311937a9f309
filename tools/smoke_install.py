"""Smoke test of an installed asyncconsumer: run with the interpreter of a clean venv, outside the checkout.

    python smoke_install.py bare --decoder c        # after `pip install asyncconsumer-*.whl`
    python smoke_install.py full --decoder c        # after `pip install "asyncconsumer-*.whl[arrow,testing]"`

``bare`` checks what the declared dependencies alone must give: the package imports (every module
that needs no extra), it is the installed copy and not a checkout, ``py.typed`` is there, the
version is the same in the metadata, ``__version__`` and the CLI, and the CLI says which record
decoder it runs (``--decoder c`` for a wheel, ``python`` for an sdist built without a compiler).
It also makes sure that the venv has nothing the package does not declare (no ``sniffio``, which
anyio no longer installs): that is what makes the import check able to fail.

``full`` (with the ``arrow`` and ``testing`` extras) starts the embedded broker, produces records
with confluent-kafka, reads them back with ``async for`` and with ``arrow_batches()``, and checks
every record.  This file imports nothing from the checkout: ``./dev nox -s package`` copies it
into a temporary directory and runs it there (docs/releasing.md).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

#: Modules that need an extra (pyarrow, confluent-kafka, pyspark, opentelemetry, prometheus_client, httpx):
#: the bare install imports everything else.
NEEDS_EXTRA = ("asyncconsumer.spark", "asyncconsumer.testing.producer", "asyncconsumer.testing.pytest_plugin",
               "asyncconsumer.testing.certs", "asyncconsumer.testing.pytest_schema_registry",
               "asyncconsumer.prometheus", "asyncconsumer.demo", "asyncconsumer.schema_registry")
RECORDS = 300


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"smoke test FAILED: {what}")
    print(f"ok  {what}", flush=True)


def module_names(package: Path) -> list[str]:
    """Every module of the installed package, from its files (importing nothing)."""
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def bare(decoder: str, checkout: Path | None) -> None:
    import asyncconsumer

    location = Path(asyncconsumer.__file__).resolve().parent
    check("site-packages" in location.parts, f"asyncconsumer is the installed copy ({location})")
    if checkout is not None:
        check(checkout.resolve() not in location.parents, "asyncconsumer is not imported from the checkout")
    modules = [name for name in module_names(location) if not name.startswith(NEEDS_EXTRA)]
    for name in modules:
        importlib.import_module(name)
    check(len(modules) > 40, f"{len(modules)} modules import with the declared dependencies alone")
    check(importlib.resources.files("asyncconsumer").joinpath("py.typed").is_file(), "py.typed is installed")
    startup = location / "spark" / "_startup" / "sitecustomize.py"  # a directory without __init__.py
    check(startup.is_file(), "the Spark source's start-up sitecustomize is installed")
    metadata = importlib.metadata.version("asyncconsumer")
    check(asyncconsumer.__version__ == metadata, f"__version__ {asyncconsumer.__version__} == metadata {metadata}")
    from asyncconsumer.protocol import records

    check(records.DECODER == decoder, f"record decoder {records.DECODER!r} (expected {decoder!r}): "
                                      f"{records.DECODER_DETAIL}")
    cli = Path(sys.executable).parent / "asyncconsumer"
    out = subprocess.run([str(cli), "--version"], capture_output=True, text=True, check=True).stdout
    check(out.splitlines()[0] == f"asyncconsumer {metadata}", f"`asyncconsumer --version` says {out.splitlines()[0]!r}")
    wanted = "record decoder: compiled" if decoder == "c" else "record decoder: pure Python"
    check(wanted in out, f"`asyncconsumer --version` names the decoder: {out.splitlines()[1]!r}")
    usage = subprocess.run([sys.executable, "-m", "asyncconsumer", "--help"], capture_output=True, text=True)
    check(usage.returncode == 0 and "consume" in usage.stdout, "`python -m asyncconsumer --help` lists the commands")


def full() -> None:
    import anyio
    import pyarrow as pa

    from asyncconsumer import Consumer, TopicPartition
    from asyncconsumer.testing import EmbeddedBroker
    from asyncconsumer.testing.producer import create_topic, produce

    values = {f"value-{i}".encode() for i in range(RECORDS)}
    with EmbeddedBroker() as broker:
        topic = create_topic(broker.bootstrap, f"smoke-{os.getpid()}", partitions=2)
        produce(broker.bootstrap, topic, [(i % 2, f"key-{i}", f"value-{i}") for i in range(RECORDS)])
        partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

        async def read_records() -> set[bytes]:
            seen: set[bytes] = set()
            async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
                consumer.assign(partitions)
                with anyio.fail_after(60):
                    async for record in consumer:
                        seen.add(record.value)
                        if len(seen) == RECORDS:
                            break
            return seen

        async def read_arrow() -> pa.Table:
            batches = []
            async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
                consumer.assign(partitions)
                with anyio.fail_after(60):
                    async for batch in consumer.arrow_batches():
                        batches.append(batch)
                        if sum(b.num_rows for b in batches) >= RECORDS:
                            break
            return pa.Table.from_batches(batches)

        started = time.monotonic()
        check(anyio.run(read_records) == values, f"async for read all {RECORDS} records from the embedded broker")
        table = anyio.run(read_arrow)
        check(set(table.column("value").to_pylist()) == values and table.num_rows == RECORDS,
              f"arrow_batches() read all {RECORDS} records ({table.num_columns} columns: "
              f"{', '.join(table.schema.names)})")
        print(f"    (consumed in {time.monotonic() - started:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["bare", "full"])
    parser.add_argument("--decoder", choices=["c", "python"], required=True,
                        help="the record decoder this install must run")
    parser.add_argument("--checkout", type=Path, default=None, help="the source checkout, which must not be imported")
    args = parser.parse_args()
    if args.stage == "bare":
        check(importlib.util.find_spec("sniffio") is None, "the venv has nothing undeclared (no sniffio)")
    bare(args.decoder, args.checkout)
    if args.stage == "full":
        full()
    print(f"smoke test passed: {args.stage}, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
