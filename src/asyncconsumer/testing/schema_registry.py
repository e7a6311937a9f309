"""A real schema registry for tests: Apicurio Registry 2.4.2, built from Maven Central, serving the
Confluent-compatible API at ``/apis/ccompat/v7``.  No Docker.

    from asyncconsumer.testing import SchemaRegistry

    with SchemaRegistry() as registry:          # or: async with SchemaRegistry() as registry:
        registry.url                            # http://127.0.0.1:PORT/apis/ccompat/v7

confluent-kafka's serializers (``SchemaRegistryClient({"url": registry.url})``), Java's
KafkaAvroSerializer and :class:`asyncconsumer.schema_registry.SchemaRegistryClient` all talk to it.

The story of one start:

1. **Java and Maven.** ``java`` 17+ as for :class:`~asyncconsumer.testing.KafkaBroker`; ``mvn`` on
   ``PATH`` for the one build (otherwise :class:`SchemaRegistryBuildError` says what to install).
2. **Build, once.** Apicurio publishes its application as jars on Maven Central, not as a runnable
   program; the recipe below (:data:`POM`, a wrapper project that runs Quarkus's build over the
   published application jar) is written into ``<cache>/apicurio-registry-2.4.2-<recipe hash>/``
   and built there with ``mvn package`` (about a minute and 210 MB of jars into the local Maven
   repository the first time; later builds need no network), under a file lock so parallel test
   workers build it once.  ``ASYNCCONSUMER_APICURIO_JAR`` names a runner jar built elsewhere
   instead; ``ASYNCCONSUMER_CACHE_DIR`` moves the cache, as for the Kafka jars.
3. **Start.** ``java -jar`` on a free loopback port, in-memory storage, its log in a temporary
   directory; ready when ``/apis/ccompat/v7/subjects`` answers (3 s on a quiet machine, up to 15 s
   on a loaded one).  A registry that exits or does not answer in time is a
   :class:`SchemaRegistryStartError` with the end of its log.
4. **Stop.** By its own pid: SIGTERM, then SIGKILL after a grace period.

Caveats of Apicurio 2.4.2 (what a test may meet): schema text is compared exactly (the same schema
with other whitespace is another version); ``?format=serialized`` is ignored (a Protobuf schema
comes back as it was registered: a base64 descriptor from confluent-kafka's Python serializer,
``.proto`` text from most others); ids are Apicurio's content ids.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Self

from ._java import JavaNotFoundError, cache_dir, file_lock, find_java
from ._process import Service, parent_death_signal, stop_process

__all__ = [
    "APICURIO_VERSION",
    "CCOMPAT_PATH",
    "SchemaRegistry",
    "SchemaRegistryBuildError",
    "SchemaRegistryStartError",
    "SchemaRegistryTestError",
    "apicurio_runner",
]

APICURIO_VERSION = "2.4.2.Final"
#: Where Apicurio serves the Confluent-compatible API.
CCOMPAT_PATH = "/apis/ccompat/v7"
LOOPBACK = "127.0.0.1"
ENV_JAR = "ASYNCCONSUMER_APICURIO_JAR"
ENV_MAVEN = "ASYNCCONSUMER_MAVEN"

#: The wrapper project: Apicurio's published application jar, packaged by Quarkus into a runner.
#: Two pins make it build from Maven Central alone: apicurio-common-app-components-config-index
#: 0.1.10.Final (0.1.18's deployment jar is not published; the runtime jars hold the same files), and
#: everit-json-schema from com.github.erosb 1.14.2 (the com.github.everit-org artifact Apicurio
#: names is not on Maven Central).  Apicurio 3.x cannot be built from Maven Central this way.
POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sr</groupId>
  <artifactId>apicurio-registry-runner</artifactId>
  <version>1</version>
  <packaging>jar</packaging>
  <properties>
    <apicurio.version>2.4.2.Final</apicurio.version>
    <quarkus.version>2.16.4.Final</quarkus.version>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>io.apicurio</groupId>
        <artifactId>apicurio-common-app-components-config-index</artifactId>
        <version>0.1.10.Final</version>
      </dependency>
      <dependency>
        <groupId>io.apicurio</groupId>
        <artifactId>apicurio-registry</artifactId>
        <version>${apicurio.version}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-registry-app</artifactId>
      <version>${apicurio.version}</version>
      <exclusions>
        <exclusion><groupId>com.github.everit-org.json-schema</groupId><artifactId>org.everit.json.schema</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>com.github.erosb</groupId>
      <artifactId>everit-json-schema</artifactId>
      <version>1.14.2</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>io.quarkus</groupId>
        <artifactId>quarkus-maven-plugin</artifactId>
        <version>${quarkus.version}</version>
        <executions>
          <execution>
            <goals><goal>build</goal></goals>
          </execution>
        </executions>
      </plugin>
    </plugins>
  </build>
</project>
"""
#: The published application jar has no class index: Quarkus is told to index it.
APPLICATION_PROPERTIES = """\
quarkus.index-dependency.registry-app.group-id=io.apicurio
quarkus.index-dependency.registry-app.artifact-id=apicurio-registry-app
"""
RUNNER = "target/apicurio-registry-runner-1-runner.jar"


class SchemaRegistryTestError(RuntimeError):
    """The test schema registry could not be provided (the message says why and what to do)."""


class SchemaRegistryBuildError(SchemaRegistryTestError):
    """Building Apicurio failed: no Maven, no Java, no Maven Central, or the build itself."""


class SchemaRegistryStartError(SchemaRegistryTestError):
    """The registry process exited or did not answer in time."""


def _recipe_dir() -> Path:
    digest = hashlib.sha256((POM + APPLICATION_PROPERTIES).encode()).hexdigest()[:12]
    return cache_dir() / f"apicurio-registry-{APICURIO_VERSION.removesuffix('.Final')}-{digest}"


def apicurio_runner(*, progress: IO[str] | None = None) -> Path:
    """The runner jar of Apicurio Registry, built first if needed (once per recipe, under a lock).

    ``ASYNCCONSUMER_APICURIO_JAR`` names a runner jar to use instead (its ``lib/`` beside it)."""
    override = os.environ.get(ENV_JAR)
    if override:
        jar = Path(override).expanduser()
        if not jar.is_file():
            raise SchemaRegistryBuildError(f"{ENV_JAR}={override}: no such file")
        return jar
    target = _recipe_dir()
    marker = target / ".complete"
    if marker.exists():
        return target / RUNNER
    with file_lock(target.with_name(target.name + ".lock")):
        if not marker.exists():  # another process may have built it while we waited
            _build(target, progress if progress is not None else sys.stderr)
            marker.write_text(APICURIO_VERSION + "\n")
    return target / RUNNER


def _maven() -> str:
    mvn = os.environ.get(ENV_MAVEN) or shutil.which("mvn")
    if not mvn:
        raise SchemaRegistryBuildError(
            "the test schema registry (Apicurio Registry) is built once with Maven, and no 'mvn' is on PATH: "
            "install Maven (Debian/Ubuntu: apt install maven; macOS: brew install maven) or set "
            f"{ENV_MAVEN}=/path/to/mvn, or point {ENV_JAR} at a runner jar built elsewhere"
        )
    return mvn


def _java() -> str:
    try:
        return find_java()[0]
    except JavaNotFoundError as exc:
        raise SchemaRegistryBuildError(f"the test schema registry (Apicurio) runs on Java 17+: {exc}") from None


def _build(target: Path, out: IO[str]) -> None:
    mvn, java = _maven(), _java()
    shutil.rmtree(target, ignore_errors=True)
    (target / "src" / "main" / "resources").mkdir(parents=True)
    (target / "pom.xml").write_text(POM)
    (target / "src" / "main" / "resources" / "application.properties").write_text(APPLICATION_PROPERTIES)
    print(
        f"asyncconsumer: building Apicurio Registry {APICURIO_VERSION} with Maven into {target} (once; the first "
        "build downloads about 210 MB of jars from Maven Central into the local Maven repository)",
        file=out, flush=True,
    )
    began = time.monotonic()
    env = dict(os.environ)
    env.setdefault("JAVA_HOME", str(Path(java).resolve().parent.parent))
    try:
        result = subprocess.run(
            [mvn, "-B", "-q", "-DskipTests", "-f", str(target / "pom.xml"), "package"],
            cwd=target, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL, env=env, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SchemaRegistryBuildError(f"could not run {mvn}: {exc}") from None
    if result.returncode != 0 or not (target / RUNNER).is_file():
        lines = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line or "FATAL" in line]
        summary = "\n".join(lines[-15:]) or (result.stdout + result.stderr).strip()[-2000:]
        raise SchemaRegistryBuildError(
            f"building Apicurio Registry with Maven failed (exit code {result.returncode}) in {target}:\n{summary}\n"
            "(Maven needs Maven Central once, or a mirror in ~/.m2/settings.xml)"
        )
    print(f"asyncconsumer: built Apicurio Registry in {time.monotonic() - began:.0f} s", file=out, flush=True)


class SchemaRegistry(Service):
    """Apicurio Registry on a free loopback port, for tests; Confluent's API at :attr:`url`.

    ``port``
        The port to listen on (default: a free one, leased until :meth:`stop`).
    ``startup_timeout``
        Seconds to wait for it to answer (default 120, a loaded machine's first start included).
    ``heap_mb``
        The JVM's heap (default 256 MB; the process takes about 220 MB of memory).
    """

    def __init__(self, *, port: int | None = None, startup_timeout: float = 120.0, heap_mb: int = 256) -> None:
        self.port = self._own_port(port)
        self.startup_timeout = startup_timeout
        self.heap_mb = heap_mb
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._directory: Path | None = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "stopped"
        return f"<SchemaRegistry Apicurio {APICURIO_VERSION} at {self.url} ({state})>"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: Apicurio's own root (its health checks, metrics, own API)."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API, ``http://127.0.0.1:PORT/apis/ccompat/v7``: give it to
        ``SchemaRegistryClient(url)`` and to confluent-kafka's ``{"url": ...}``."""
        return self.base_url + CCOMPAT_PATH

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_file(self) -> Path | None:
        return self._directory / "registry.log" if self._directory is not None else None

    def log_tail(self, lines: int = 30) -> str:
        log = self.log_file
        try:
            text = log.read_text(errors="replace") if log is not None else ""
        except OSError:
            return "(no log)"
        keep = [line for line in text.splitlines() if not line.startswith(("\tat ", "\t..."))]
        return "\n".join(keep[-lines:]) or "(empty log)"

    # -- start / stop -------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._process is not None:
            raise SchemaRegistryTestError("already started")
        began = time.monotonic()
        runner = apicurio_runner()
        java = _java()
        self._directory = Path(tempfile.mkdtemp(prefix="asyncconsumer-registry-"))
        log = open(self._directory / "registry.log", "ab")
        try:
            self._process = subprocess.Popen(
                [
                    java, f"-Xmx{self.heap_mb}m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                    f"-Dquarkus.http.host={LOOPBACK}", f"-Dquarkus.http.port={self.port}",
                    "-jar", str(runner),
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self._directory,
                preexec_fn=parent_death_signal(),
            )
        except OSError as exc:
            self.stop()
            raise SchemaRegistryStartError(f"could not start {java}: {exc}") from None
        finally:
            log.close()
        try:
            self._wait_ready(began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        probe = self.url + "/subjects"
        last = "no answer yet"
        while True:
            process = self._process
            if process is None or process.poll() is not None:
                code = process.returncode if process is not None else None
                raise SchemaRegistryStartError(
                    f"the schema registry exited with code {code} while starting:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(probe, timeout=2) as answer:
                    if answer.status == 200:
                        return
                    last = f"answered {answer.status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if time.monotonic() > deadline:
                raise SchemaRegistryStartError(
                    f"the schema registry did not answer {probe} within {self.startup_timeout:g} s ({last}); "
                    f"its log says:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s; its directory is removed."""
        process, self._process = self._process, None
        stop_process(process, timeout)
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        self._release_port()

    # -- what tests look at ---------------------------------------------------------------------------

    def request_count(self, path: str, method: str = "GET") -> int:
        """How many ``method`` requests the registry has answered for ``path``, a path template of
        the Confluent API as Apicurio's metrics name it: ``"/schemas/ids/{id}"``,
        ``"/subjects/{subject}/versions/{version}"`` ... (every status counted)."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        full = CCOMPAT_PATH + path
        total = 0.0
        for line in text.splitlines():
            # rest_requests_seconds_count{method="GET",path="/apis/ccompat/v7/schemas/ids/{id}",...} 3.0
            match = re.fullmatch(r"rest_requests_seconds_count\{(.*)\} (\S+)", line.strip())
            if match is not None:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
                if labels.get("method") == method and labels.get("path") == full:
                    total += float(match.group(2))
        return int(total)
