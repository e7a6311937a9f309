"""Fixtures of the kafkatest scenarios (docs/kafkatest.md).

- ``client``: each scenario runs once per client of ``--kafkatest-clients`` (default: all of
  ``java``, ``asyncconsumer-asyncio``, ``asyncconsumer-trio``).  A client that cannot run (no
  ``verifiable-consumer`` subcommand) fails its tests with the reason; it is never skipped.
- ``scenario``: the test's :class:`Scenario` on a cluster of the shape its ``kafkatest_cluster``
  marker asks for (and ``enable_assignment_batching`` when the test has that parameter).  Its
  processes are killed at the end whatever happened, and its figures and outcome go to the
  ``--kafkatest-results`` file (JSON lines) when one is named.

Tests are reordered so that those of one cluster shape run in a row.  Each has a pytest-timeout
of 20 minutes unless it says otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .clients import CLIENTS, Client
from .cluster import ClusterPool, Shape
from .matrix import CI_SUBSET, ci_key
from .report import outcome as outcome_of
from .services import Scenario


def selected_clients(config: pytest.Config) -> list[Client]:
    names = [n.strip() for n in str(config.getoption("--kafkatest-clients")).split(",") if n.strip()]
    unknown = [n for n in names if n not in CLIENTS]
    if unknown:
        raise pytest.UsageError(f"--kafkatest-clients: unknown {unknown}; choose from {sorted(CLIENTS)}")
    return [CLIENTS[n] for n in names]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "client" in metafunc.fixturenames:
        clients = selected_clients(metafunc.config)
        metafunc.parametrize("client", clients, ids=[c.name for c in clients])


def shape_of(item: pytest.Item) -> Shape:
    marker = item.get_closest_marker("kafkatest_cluster")
    brokers, controllers = (marker.kwargs["brokers"], marker.kwargs["controllers"]) if marker else (2, 1)
    params = getattr(getattr(item, "callspec", None), "params", {})
    return Shape(brokers, controllers, bool(params.get("enable_assignment_batching", True)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    if not ours:
        return
    for item in ours:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(1200))
        key, client = ci_key(item)
        if client in CI_SUBSET.get(key, ()):
            item.add_marker(pytest.mark.kafkatest_ci)
    order = {id(item): index for index, item in enumerate(items)}
    ours.sort(key=lambda item: (str(shape_of(item)), order[id(item)]))
    slots = iter(ours)
    items[:] = [next(slots) if Path(str(item.fspath)).is_relative_to(here) else item for item in items]


@pytest.fixture(scope="session")
def cluster_pool() -> Iterator[ClusterPool]:
    pool = ClusterPool()
    try:
        yield pool
    finally:
        pool.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"kafkatest_{report.when}", report)
    return report


@pytest.fixture
def scenario(request: pytest.FixtureRequest, cluster_pool: ClusterPool, tmp_path: Path) -> Iterator[Scenario]:
    scale = float(request.config.getoption("--kafkatest-timeout-scale"))
    client = request.node.callspec.params.get("client") if hasattr(request.node, "callspec") else None
    if isinstance(client, Client):  # a client that cannot run fails here, before any cluster starts
        client.check(getattr(request.module, "TOOL", "consumer"))
    cluster = cluster_pool.get(shape_of(request.node))
    run = Scenario(cluster, tmp_path, timeout_scale=scale)
    try:
        yield run
    finally:
        run.close()
        _record(request, run)


def _record(request: pytest.FixtureRequest, run: Scenario) -> None:
    path = request.config.getoption("--kafkatest-results")
    if not path:
        return
    item = request.node
    setup, call = getattr(item, "kafkatest_setup", None), getattr(item, "kafkatest_call", None)
    outcome = outcome_of(setup, call)
    report = call if call is not None else setup
    failure = ""
    if report is not None and report.failed:
        failure = str(report.longrepr.reprcrash.message if hasattr(report.longrepr, "reprcrash") else report.longrepr)
    callspec = getattr(item, "callspec", None)
    params = {k: (str(v) if k == "client" else v) for k, v in (callspec.params if callspec else {}).items()}
    row = {
        "test": item.nodeid, "scenario": item.originalname, "params": params, "outcome": outcome,
        "seconds": round(time.monotonic() - run.began, 1), "figures": run.figures,
        "failure": failure.splitlines()[0][:300] if failure else "",
    }
    with open(path, "a") as out:
        out.write(json.dumps(row) + "\n")
