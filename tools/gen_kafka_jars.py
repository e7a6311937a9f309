"""Generate src/asyncconsumer/testing/_kafka_jars.py: the pinned jar lists of the Apache Kafka releases
``KafkaBroker`` can start.

``asyncconsumer.testing.KafkaBroker`` runs Apache Kafka from its jars on Maven Central, without
Docker, without a tarball and without Maven on the user's machine.  This tool is the only place
Maven is used: for each release it resolves the runtime classpath of ``kafka_2.13`` (the broker,
KRaft, the storage tool) and ``kafka-tools`` (ConsumerPerformance, VerifiableProducer,
VerifiableConsumer, the console share consumer, the feature and group commands), adds the SLF4J
binding Kafka ships only in its tarball when the classpath lacks one (4.x: ``log4j-slf4j-impl`` at
the version of the ``log4j-core`` it brings in, or, for 4.0.x, whose Maven classpath has no Log4j at
all, at the version its tarball ships; 3.x brings ``slf4j-reload4j`` itself), checks every
jar against Maven Central's own ``.sha1``, and writes the coordinates with their SHA-256 and size.

    python tools/gen_kafka_jars.py                  # every release in RELEASES
    python tools/gen_kafka_jars.py 4.4.0 3.9.2      # only these (the others are kept as they are)

Needs Java and Maven.  ``RELEASES[0]`` is the reference (``KAFKA_VERSION``, what ``KafkaBroker()``
starts); the others are the newest patch release of each older line users still run.
"""

from __future__ import annotations

import ast
import hashlib
import pathlib
import subprocess
import sys
import tempfile
import urllib.request

#: The reference first, then one release of each older line (the newest patch Maven Central serves).
RELEASES = ("4.4.0", "4.0.2", "3.9.2", "3.7.2")
CENTRAL = "https://repo1.maven.org/maven2"
ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "asyncconsumer" / "testing" / "_kafka_jars.py"

POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.asyncconsumer</groupId>
  <artifactId>kafka-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
{extra}  </dependencies>
</project>
"""
BINDING = """    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version><scope>runtime</scope></dependency>
"""
#: The Log4j 2 of a release whose Maven classpath has no log4j-core (4.0.x: the tarball's libs/).
LOG4J2_BY_LINE = {"4.0": "2.24.3"}
#: SLF4J bindings: a classpath with one of these logs through it.
BINDINGS = {"log4j-slf4j-impl", "log4j-slf4j2-impl", "slf4j-reload4j", "slf4j-log4j12"}

Jar = tuple[str, str, str, pathlib.Path]


def _resolve(version: str, extra: str) -> list[Jar]:
    with tempfile.TemporaryDirectory() as tmp:
        pom = pathlib.Path(tmp) / "pom.xml"
        pom.write_text(POM.format(kafka=version, extra=extra))
        listing = pathlib.Path(tmp) / "deps.txt"
        subprocess.run(
            ["mvn", "-q", "-B", "-f", str(pom), "dependency:list", "-DincludeScope=runtime",
             f"-DoutputFile={listing}", "-DoutputAbsoluteArtifactFilename=true"],
            check=True,
        )
        jars = []
        for line in listing.read_text().splitlines():
            line = line.strip().split(" -- ")[0]
            if line.count(":") < 5:
                continue
            group, artifact, kind, ver, _scope, path = line.split(":", 5)
            if kind == "jar":
                jars.append((group, artifact, ver, pathlib.Path(path)))
        return sorted(jars)


def resolve(version: str) -> list[Jar]:
    """The runtime jars of ``version``, with an SLF4J binding (added when Kafka brings none)."""
    jars = _resolve(version, "")
    if any(artifact in BINDINGS for _, artifact, _, _ in jars):
        return jars
    log4j = [ver for group, artifact, ver, _ in jars if (group, artifact) == ("org.apache.logging.log4j", "log4j-core")]
    if not log4j:
        line = ".".join(version.split(".")[:2])
        if line not in LOG4J2_BY_LINE:
            raise SystemExit(f"Kafka {version}: no SLF4J binding and no log4j-core; add its line to LOG4J2_BY_LINE")
        log4j = [LOG4J2_BY_LINE[line]]
    # The binding brings log4j-core along (a runtime dependency of it).
    return _resolve(version, BINDING.format(log4j=log4j[0]))


def rows_for(version: str) -> list[tuple[str, str, str, str, int]]:
    rows = []
    for group, artifact, ver, path in resolve(version):
        data = path.read_bytes()
        url = f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/{ver}/{artifact}-{ver}.jar"
        with urllib.request.urlopen(url + ".sha1", timeout=30) as answer:
            central_sha1 = answer.read().decode().split()[0].strip()
        if hashlib.sha1(data).hexdigest() != central_sha1:
            raise SystemExit(f"{path.name}: SHA-1 differs from Maven Central's {url}.sha1")
        rows.append((group, artifact, ver, hashlib.sha256(data).hexdigest(), len(data)))
    return rows


def _existing() -> dict[str, list[tuple[str, str, str, str, int]]]:
    """The jar lists already generated (kept for releases not named on the command line)."""
    if not OUT.exists():
        return {}
    for node in ast.parse(OUT.read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "RELEASES":
            assert node.value is not None
            return {k: list(v) for k, v in ast.literal_eval(node.value).items()}
    return {}


def main() -> None:
    wanted = sys.argv[1:] or list(RELEASES)
    unknown = [v for v in wanted if v not in RELEASES]
    if unknown:
        raise SystemExit(f"{unknown}: not in RELEASES {RELEASES} (add it there first)")
    releases = _existing()
    for version in wanted:
        releases[version] = rows_for(version)
    missing = [v for v in RELEASES if v not in releases]
    if missing:
        raise SystemExit(f"no jar list for {missing}: run without arguments")
    lines = [
        '"""Generated by tools/gen_kafka_jars.py: the runtime jars of the Apache Kafka releases on Maven Central',
        'that ``KafkaBroker`` starts."""',
        "",
        "#: The reference release: what ``KafkaBroker()`` starts when no ``version`` is given.",
        f'KAFKA_VERSION = "{RELEASES[0]}"',
        "",
        "#: release -> its jars: (groupId, artifactId, version, SHA-256, size in bytes).",
        "RELEASES: dict[str, tuple[tuple[str, str, str, str, int], ...]] = {",
    ]
    for version in RELEASES:
        lines.append(f'    "{version}": (')
        lines += [f'        ("{g}", "{a}", "{v}", "{h}", {n}),' for g, a, v, h, n in releases[version]]
        lines.append("    ),")
    lines += ["}", "", "#: The reference release's jars.", "JARS = RELEASES[KAFKA_VERSION]", ""]
    OUT.write_text("\n".join(lines))
    for version in RELEASES:
        rows = releases[version]
        print(f"{version}: {len(rows)} jars, {sum(r[4] for r in rows) / 1e6:.1f} MB")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
