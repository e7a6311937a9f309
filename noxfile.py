"""Developer/CI sessions.  Run them through ``./dev`` (it bootstraps ``.venv`` first).

Every session uses ``venv_backend="none"``: it runs in the environment nox itself runs in, which
``./dev`` makes the project's ``.venv``.  No session pins an interpreter, so nox never reports a
missing one (under ``CI=true`` it would otherwise error).
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.error_on_missing_interpreters = False

LINT_PATHS = ("src", "tests", "benchmarks", "examples", "tools", "noxfile.py")

#: The older Apache Kafka releases ``versions`` runs against, one of each line users still run
#: (``asyncconsumer.testing.KAFKA_VERSIONS`` less the reference, which ``tests`` runs against).
OLDER_KAFKA = ("4.0.2", "3.9.2", "3.7.2")
#: The core, group, offsets and transactions tests.
VERSION_TESTS = ("tests/consumer/test_consumer.py", "tests/groups/test_groups.py",
                 "tests/consumer/test_offsets_kafka.py", "tests/consumer/test_transactions.py")
#: ``--quick`` (the CI subset): asyncio only, without the slowest tests (100 k records; groups shared
#: with librdkafka members; members coming and going under load): those run on the reference.
QUICK = "not trio and not 100k and not librdkafka_member and not members_come_and_go"


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """pytest (extra arguments are passed through: ./dev test -k name -x).

    The whole suite (no arguments) runs on ``ASYNCCONSUMER_TEST_WORKERS`` pytest-xdist workers
    (default 2; 0 runs it in one process).  ``--dist loadgroup`` keeps every test of one broker on
    one worker (tests/conftest.py groups them), so the Tansu and Apache Kafka halves run side by
    side.  With arguments, pytest runs in one process unless the arguments say otherwise."""
    args = list(session.posargs)
    workers = os.environ.get("ASYNCCONSUMER_TEST_WORKERS", "2")
    if not args and workers not in ("", "0", "1"):
        args = ["-n", workers, "--dist", "loadgroup"]
    session.run("python", "-m", "pytest", *args)


@nox.session(venv_backend="none")
def long(session: nox.Session) -> None:
    """The tests marked ``long``, scenarios of minutes each that the whole suite leaves out (the
    rolling restart of a three-node cluster, every broker down and back): ``./dev nox -s long``.
    ``-m long`` selects them wherever they are (tests/conftest.py)."""
    session.run("python", "-m", "pytest", "-m", "long", *session.posargs)


@nox.session(venv_backend="none")
def chaos(session: nox.Session) -> None:
    """Both chaos tests on Apache Kafka under CPU pressure, one seed after another:
    ``./dev nox -s chaos -- [RUNS (5)] [BUSY PROCESSES (4)]`` (seeds 14, 15, ...; see
    tests/resilience/test_cluster_chaos.py and docs/failure-behaviour.md)."""
    runs = int(session.posargs[0]) if session.posargs else 5
    busy = session.posargs[1] if len(session.posargs) > 1 else "4"
    for seed in range(14, 14 + runs):
        session.log(f"chaos run {seed - 13}/{runs}: seed {seed}, {busy} busy processes")
        session.run("python", "-m", "pytest", "-q", "-s", "-p", "no:randomly", "tests/resilience/test_cluster_chaos.py",
                    "tests/groups/test_storm_chaos.py", env={"ASYNCCONSUMER_CHAOS_SEED": str(seed),
                                                      "ASYNCCONSUMER_CPU_PRESSURE": busy,
                                                      "ASYNCCONSUMER_TEST_BROKER": "kafka"})


@nox.session(venv_backend="none")
def versions(session: nox.Session) -> None:
    """The core, group, offsets and transactions tests against each older Apache Kafka release
    (``OLDER_KAFKA``; one pytest run each, on a broker of that release), then
    tests/testing/test_broker_versions.py (fallbacks and typed errors where a release lacks a feature).

    ``-- --quick`` is the CI subset: asyncio only and without the slowest tests (``QUICK``).
    ``-- 3.9.2`` runs one release; other arguments go to pytest."""
    args = list(session.posargs)
    quick = "--quick" in args
    releases = [arg for arg in args if arg in OLDER_KAFKA]
    rest = [arg for arg in args if arg != "--quick" and arg not in releases]
    for release in releases or OLDER_KAFKA:
        session.log(f"Apache Kafka {release}")
        env = {"ASYNCCONSUMER_TEST_BROKER": "kafka", "ASYNCCONSUMER_KAFKA_VERSION": release}
        session.run("python", "-m", "pytest", *VERSION_TESTS, *(["-k", QUICK] if quick else []), *rest, env=env)
    if not quick and not releases:
        session.run("python", "-m", "pytest", "tests/testing/test_broker_versions.py", *rest)


@nox.session(venv_backend="none")
def kafkatest(session: nox.Session) -> None:
    """kafkatest's consumer and share-consumer scenarios (tests/kafkatest, docs/kafkatest.md): the full
    matrix, every scenario with Kafka's Java tools and asyncconsumer on asyncio and trio (hours on
    two cores).  Extra arguments go to pytest: ``-m kafkatest_ci`` is the CI subset,
    ``--kafkatest-clients=java`` one client, ``-k`` a scenario.  Each scenario's outcome and figures
    are appended to build/kafkatest-results.jsonl (``python tests/kafkatest/report.py`` tabulates
    them); the whole suite (``./dev test``) leaves tests/kafkatest out."""
    os.makedirs("build", exist_ok=True)
    session.run("python", "-m", "pytest", "tests/kafkatest", "-rfE",
                "--kafkatest-results=build/kafkatest-results.jsonl", *session.posargs)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff check (add --format to also require ruff-format-clean files)."""
    session.run("ruff", "check", *LINT_PATHS)
    if "--format" in session.posargs:
        session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session(venv_backend="none")
def fmt(session: nox.Session) -> None:
    """Apply ruff's formatter and safe autofixes."""
    session.run("ruff", "format", *LINT_PATHS)
    session.run("ruff", "check", "--fix", *LINT_PATHS)


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy, configured in pyproject.toml (strict on src/asyncconsumer and benchmarks/)."""
    session.run("mypy", *session.posargs)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """The end-to-end demo."""
    session.run("python", "-m", "asyncconsumer.demo", *session.posargs)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks (arguments are passed through)."""
    session.run("python", "-m", "benchmarks.run", *session.posargs)


@nox.session(venv_backend="none")
def package(session: nox.Session) -> None:
    """Build the sdist and manylinux wheels into dist/ and smoke-test each installed into a clean venv
    outside the checkout, the sdist with no compiler on PATH (tools/package.py; docs/installing.md)."""
    session.run("python", "tools/package.py", *session.posargs)


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml) into site/, strict: a broken link or anchor, or a page left out
    of nav, fails.  ``./dev docs serve`` previews it instead; ``./dev docs check`` builds it and
    checks it in headless Chromium (tools/check_site.py)."""
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:])
    elif session.posargs[:1] == ["check"]:
        # ... then look at it in headless Chromium (tools/check_site.py: search, blank pages, other
        # hosts, tables and code blocks).
        session.run("mkdocs", "build", "--strict")
        session.run("python", "tools/check_site.py", *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs)
