"""A local Apache Kafka image, made from what this machine has: nothing is pulled.

The container broker (``asyncconsumer.testing.ContainerBroker``) runs Apache Kafka's official image,
``apache/kafka``, where a registry can be reached.  The project's machines reach none, so its tests
run the same broker on an image made here, with the same conventions where clients and the broker's
settings depend on them (the ``KAFKA_*`` variables, where it listens, the readiness line).

    python -m tools.kafka_image                       # local/kafka:4.4.0 from KafkaBroker's jar cache
    python -m tools.kafka_image --libs DIR --tag T    # another directory of jars (a tarball's libs/)

How it is made: one tar stream of a root filesystem, fed to ``docker import`` (no ``docker build``,
no base image).  Every file's owner is set in the stream (numeric ids), so building needs no root,
only a running Docker daemon.  The root filesystem holds

- ``/opt/java/openjdk``: the JRE of the ``java`` on this machine (``bin/java``, ``bin/keytool``,
  ``conf/``, ``lib/`` without the JDK's ``src.zip`` and ``ct.sym``), symbolic links followed (into
  ``/etc/java-*``, the CA certificates), where the official image has its JRE;
- the shared libraries ``ldd`` names for ``java``, ``libjvm.so`` and the JRE's non-graphical
  libraries, at their own paths, and the dynamic loader;
- a static busybox (Debian's ``busybox-static``) as ``/bin/busybox`` with a link for each of its
  commands (``sh``, ``sed``, ``grep``, ``id`` ...): the shell the scripts below run in;
- ``/etc/passwd`` and ``/etc/group`` with ``root`` and ``appuser`` (1000, the user the official image
  runs as), and ``/etc/nsswitch.conf`` resolving names from ``/etc/hosts`` only, never through DNS;
- ``/opt/kafka/libs``: the broker's jars (by default the ones ``KafkaBroker`` downloaded from Maven
  Central), and ``/opt/kafka/bin``: Kafka's launcher scripts by their names and variables
  (``kafka-run-class.sh`` reads ``KAFKA_HEAP_OPTS``, ``KAFKA_OPTS``, ``KAFKA_JVM_PERFORMANCE_OPTS``,
  ``KAFKA_LOG4J_OPTS``; ``kafka-server-start.sh``, ``kafka-storage.sh``, ``kafka-topics.sh`` ...);
- ``/etc/kafka/docker``: ``run`` (beside this file: the official image's configuration rules), the
  defaults (one KRaft node on ``localhost:9092``, controller on 9093) and the Log4j 2 files;
  ``/opt/kafka/config``, ``/mnt/shared/config``, ``/var/lib/kafka/data`` and ``/etc/kafka/secrets``.

The image runs ``/etc/kafka/docker/run`` as ``appuser``.  It carries the label
:data:`RECIPE_LABEL`, a hash of this file, ``run``, the jars' names and the JRE's release: an image
whose label matches is not built again (:func:`ensure_image`).

What differs from the official image does not reach a client: Debian's Java instead of Temurin's,
busybox's shell instead of bash, no class-data-sharing archive, no ``VOLUME``s (so no anonymous
volume is left behind), defaults listening on ``localhost`` only.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["DEFAULT_TAG", "RECIPE_LABEL", "Built", "ImageBuildError", "build_image", "ensure_image", "recipe"]

HERE = Path(__file__).resolve().parent
RUN_SCRIPT = HERE / "run"
#: The label holding the recipe's hash.
RECIPE_LABEL = "org.asyncconsumer.kafka-image.recipe"
APPUSER = 1000
JAVA_HOME = "/opt/java/openjdk"


def _default_tag() -> str:
    from asyncconsumer.testing import KAFKA_VERSION

    return f"local/kafka:{KAFKA_VERSION}"


DEFAULT_TAG = _default_tag()


class ImageBuildError(RuntimeError):
    """The image could not be made (the message says what is missing)."""


@dataclass(frozen=True)
class Built:
    """What :func:`ensure_image` did: the tag, the recipe's hash, whether it built and how long it took."""

    tag: str
    recipe: str
    built: bool
    seconds: float


# ------------------------------------------------------------------------------- what goes in

#: JRE libraries of the desktop (AWT, fonts, sound, images): never loaded by a broker, and their
#: ``ldd`` lists X11 libraries a server does not have.
_GRAPHICAL = re.compile(r"awt|font|jsound|splash|lcms|jpeg|mlib|atk")
_JRE_SKIP = {"src.zip", "ct.sym"}

#: Kafka's launcher scripts as the image has them: name -> the main class (run through kafka-run-class.sh).
_TOOLS = {
    "kafka-storage.sh": "kafka.tools.StorageTool",
    "kafka-topics.sh": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs.sh": "kafka.admin.ConfigCommand",
    "kafka-consumer-groups.sh": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-producer.sh": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer.sh": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-broker-api-versions.sh": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-metadata-quorum.sh": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-features.sh": "org.apache.kafka.tools.FeatureCommand",
    "kafka-get-offsets.sh": "org.apache.kafka.tools.GetOffsetShell",
}

_RUN_CLASS = """\
#!/bin/sh
# Kafka's bin/kafka-run-class.sh, short: the same variables, the jars of /opt/kafka/libs.
base_dir=$(cd "$(dirname "$0")/.." && pwd)
[ "$1" = "-daemon" ] && shift
[ "$1" = "-name" ] && shift 2
[ "$1" = "-loggc" ] && shift
LOG_DIR=${LOG_DIR:-$base_dir/logs}
mkdir -p "$LOG_DIR" 2>/dev/null || true
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:-"-Xmx256M"}
KAFKA_JVM_PERFORMANCE_OPTS=${KAFKA_JVM_PERFORMANCE_OPTS:-"-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
-XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true"}
KAFKA_LOG4J_OPTS=${KAFKA_LOG4J_OPTS:-"-Dlog4j2.configurationFile=$base_dir/config/tools-log4j2.yaml"}
# shellcheck disable=SC2086
exec "${JAVA_HOME:-/opt/java/openjdk}/bin/java" $KAFKA_HEAP_OPTS $KAFKA_JVM_PERFORMANCE_OPTS ${KAFKA_JMX_OPTS-} \
  $KAFKA_LOG4J_OPTS "-Dkafka.logs.dir=$LOG_DIR" -cp "${CLASSPATH:+$CLASSPATH:}$base_dir/libs/*" ${KAFKA_OPTS-} "$@"
"""

_SERVER_START = """\
#!/bin/sh
# Kafka's bin/kafka-server-start.sh, short: a 1 GB heap unless KAFKA_HEAP_OPTS says otherwise.
[ $# -lt 1 ] && { echo "usage: $0 [-daemon] server.properties [--override property=value]*"; exit 1; }
base_dir=$(cd "$(dirname "$0")/.." && pwd)
export KAFKA_LOG4J_OPTS=${KAFKA_LOG4J_OPTS:-"-Dlog4j2.configurationFile=$base_dir/config/log4j2.yaml"}
export KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:-"-Xmx1G -Xms1G"}
[ "$1" = "-daemon" ] && shift
exec "$base_dir/bin/kafka-run-class.sh" kafka.Kafka "$@"
"""

_TOOL = """\
#!/bin/sh
exec "$(dirname "$0")/kafka-run-class.sh" {main_class} "$@"
"""

#: Used when no KAFKA_* variable is set: one KRaft node for clients on localhost:9092.
_DEFAULT_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@localhost:9093
listeners=PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093
advertised.listeners=PLAINTEXT://localhost:9092
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=/tmp/kraft-combined-logs
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
"""

#: The broker's logging: INFO to stdout (the readiness line is an INFO line), the chatty loggers at WARN.
#: KafkaDockerWrapper reads this file's structure to apply KAFKA_LOG4J_ROOT_LOGLEVEL and KAFKA_LOG4J_LOGGERS.
_LOG4J2 = """\
Configuration:
  Properties:
    Property:
      - name: "logPattern"
        value: "[%d] %p %m (%c)%n"
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "${logPattern}"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: state.change.logger
        level: WARN
      - name: org.apache.kafka.controller
        level: WARN
      - name: kafka.authorizer.logger
        level: WARN
"""

#: The command-line tools': WARN to stderr.
_TOOLS_LOG4J2 = """\
Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDERR
"""


def java_home() -> Path:
    """The home of this machine's Java (``JAVA_HOME``, else the ``java`` on ``PATH``), links resolved."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else None
    if java is None or not java.exists():
        found = shutil.which("java")
        if found is None:
            raise ImageBuildError("no Java here (JAVA_HOME unset, no 'java' on PATH): the image takes this machine's")
        java = Path(found)
    return java.resolve().parent.parent


def static_busybox() -> Path:
    """A statically linked busybox (Debian: ``apt-get install busybox-static``)."""
    found = shutil.which("busybox") or "/usr/bin/busybox"
    path = Path(found)
    if not path.exists() or _ldd(path):
        raise ImageBuildError(
            f"need a statically linked busybox ({path} is {'dynamic' if path.exists() else 'missing'}): "
            "apt-get install busybox-static"
        )
    return path.resolve()


def _ldd(binary: Path) -> list[str]:
    """The absolute paths of the shared libraries (and the loader) ``binary`` needs; empty when static."""
    result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    paths = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].split()
            if target and target[0].startswith("/"):
                paths.append(target[0])
        elif line.startswith("/"):  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
            paths.append(line.split()[0])
    return paths


def _jre_binaries(jre: Path) -> Iterator[Path]:
    yield jre / "bin" / "java"
    yield jre / "lib" / "server" / "libjvm.so"
    for library in sorted((jre / "lib").glob("*.so")):
        if not _GRAPHICAL.search(library.name):
            yield library


def _shared_libraries(jre: Path) -> list[Path]:
    found: set[str] = set()
    for binary in _jre_binaries(jre):
        found.update(_ldd(binary))
    inside = str(jre) + os.sep
    return sorted(Path(p) for p in found if not p.startswith(inside))


def _jars(libs: Path) -> list[Path]:
    jars = sorted(libs.glob("*.jar"))
    if not any(jar.name.startswith("kafka_2.13-") for jar in jars):
        raise ImageBuildError(f"{libs}: no kafka_2.13-*.jar (give the directory of a Kafka release's jars)")
    return jars


def recipe(libs: Path, jre: Path | None = None) -> str:
    """The hash an image's :data:`RECIPE_LABEL` holds: this file, ``run``, the jars' names and sizes,
    the JRE's release file."""
    jre = jre or java_home()
    digest = hashlib.sha256()
    for part in (Path(__file__), RUN_SCRIPT):
        digest.update(part.read_bytes())
    for jar in _jars(libs):
        digest.update(f"{jar.name} {jar.stat().st_size}\n".encode())
    release = jre / "release"
    digest.update(release.read_bytes() if release.exists() else str(jre).encode())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------- the stream


class _RootFS:
    """Writes a root filesystem into a tar stream: parent directories first, owners by number."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self._tar = tar
        self._dirs: set[str] = {"."}

    def _info(self, path: str, kind: bytes, mode: int, owner: int, group: int) -> tarfile.TarInfo:
        name = str(PurePosixPath(path.lstrip("/")))
        self._parents(name)
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.uid, info.gid = owner, group
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    def _parents(self, name: str) -> None:
        for parent in reversed(PurePosixPath(name).parents):
            self.directory(str(parent))

    def directory(self, path: str, mode: int = 0o755, owner: int = 0, group: int = 0) -> None:
        name = str(PurePosixPath(path.lstrip("/") or "."))
        if name in self._dirs:
            return
        info = self._info(name, tarfile.DIRTYPE, mode, owner, group)
        self._dirs.add(name)
        self._tar.addfile(info)

    def data(self, path: str, content: bytes, mode: int = 0o644, owner: int = 0, group: int = 0) -> None:
        info = self._info(path, tarfile.REGTYPE, mode, owner, group)
        info.size = len(content)
        self._tar.addfile(info, io.BytesIO(content))

    def copy(self, source: Path, path: str, owner: int = 0, group: int = 0) -> None:
        """A file of this machine, its links followed, with its permission bits."""
        stat = source.stat()
        info = self._info(path, tarfile.REGTYPE, stat.st_mode & 0o7777, owner, group)
        info.size = stat.st_size
        with open(source, "rb") as file:
            self._tar.addfile(info, file)

    def copy_tree(self, source: Path, path: str, skip: Iterable[str] = ()) -> None:
        """A directory tree, links followed; dangling links and the names in ``skip`` left out."""
        skipped = set(skip)
        for root, dirs, files in os.walk(source, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d not in skipped)
            relative = Path(root).relative_to(source)
            self.directory(str(PurePosixPath(path) / relative.as_posix()))
            for name in sorted(files):
                file = Path(root) / name
                if name in skipped or not file.exists():
                    continue
                self.copy(file, str(PurePosixPath(path) / relative.as_posix() / name))

    def symlink(self, path: str, target: str) -> None:
        info = self._info(path, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target
        self._tar.addfile(info)


def _write_rootfs(tar: tarfile.TarFile, libs: Path, jre: Path, busybox: Path) -> None:
    fs = _RootFS(tar)
    for directory in ("bin", "sbin", "usr/bin", "usr/sbin", "lib64", "root", "etc"):
        fs.directory(directory, 0o700 if directory == "root" else 0o755)
    fs.directory("tmp", 0o1777)
    fs.directory("home/appuser", 0o755, APPUSER, APPUSER)

    # The JRE and the shared libraries it needs.
    for tool in ("java", "keytool"):
        fs.copy(jre / "bin" / tool, f"{JAVA_HOME}/bin/{tool}")
    if (jre / "release").exists():
        fs.copy(jre / "release", f"{JAVA_HOME}/release")
    fs.copy_tree(jre / "conf", f"{JAVA_HOME}/conf")
    fs.copy_tree(jre / "lib", f"{JAVA_HOME}/lib", skip=_JRE_SKIP)
    for library in _shared_libraries(jre):
        fs.copy(library, str(library))

    # The shell and the usual commands.
    fs.copy(busybox, "/bin/busybox")
    listing = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout
    for applet in sorted(set(listing.split())):
        if applet != "bin/busybox":
            fs.symlink(applet, "/bin/busybox")

    # Users, and names from /etc/hosts only.
    fs.data("/etc/passwd", f"root:x:0:0:root:/root:/bin/sh\nappuser:x:{APPUSER}:{APPUSER}::/home/appuser:/bin/sh\n"
            .encode())
    fs.data("/etc/group", f"root:x:0:\nappuser:x:{APPUSER}:\n".encode())
    fs.data("/etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files\n")
    fs.data("/etc/hosts", b"127.0.0.1 localhost\n")

    # Kafka: jars, launchers, configuration.
    kafka = (APPUSER, APPUSER)
    for directory in ("/opt/kafka", "/opt/kafka/bin", "/opt/kafka/libs", "/opt/kafka/config", "/opt/kafka/logs",
                      "/mnt/shared/config", "/usr/logs"):
        fs.directory(directory, 0o755, *kafka)
    for jar in _jars(libs):
        fs.copy(jar, f"/opt/kafka/libs/{jar.name}", *kafka)
    fs.data("/opt/kafka/bin/kafka-run-class.sh", _RUN_CLASS.encode(), 0o755, *kafka)
    fs.data("/opt/kafka/bin/kafka-server-start.sh", _SERVER_START.encode(), 0o755, *kafka)
    for name, main_class in _TOOLS.items():
        fs.data(f"/opt/kafka/bin/{name}", _TOOL.format(main_class=main_class).encode(), 0o755, *kafka)
    fs.data("/opt/kafka/config/log4j2.yaml", _LOG4J2.encode(), 0o664, *kafka)
    fs.data("/opt/kafka/config/tools-log4j2.yaml", _TOOLS_LOG4J2.encode(), 0o664, *kafka)
    # As in the official image: owned by appuser, group root, group-writable.
    docker = (APPUSER, 0)
    for directory in ("/etc/kafka", "/etc/kafka/docker", "/etc/kafka/secrets", "/var/lib/kafka",
                      "/var/lib/kafka/data"):
        fs.directory(directory, 0o775, *docker)
    fs.data("/etc/kafka/docker/run", RUN_SCRIPT.read_bytes(), 0o775, *docker)
    fs.data("/etc/kafka/docker/server.properties", _DEFAULT_SERVER_PROPERTIES.encode(), 0o664, *docker)
    fs.data("/etc/kafka/docker/log4j2.yaml", _LOG4J2.encode(), 0o664, *docker)
    fs.data("/etc/kafka/docker/tools-log4j2.yaml", _TOOLS_LOG4J2.encode(), 0o664, *docker)


# ------------------------------------------------------------------------------------- docker


def _docker(*args: str, docker: str = "docker") -> subprocess.CompletedProcess[str]:
    return subprocess.run([docker, *args], capture_output=True, text=True, check=False, timeout=120)


def image_recipe(tag: str, *, docker: str = "docker") -> str | None:
    """The :data:`RECIPE_LABEL` of the local image ``tag``; None when there is no such image."""
    result = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{RECIPE_LABEL}"}}}}', tag,
                     docker=docker)
    if result.returncode != 0:
        return None
    return result.stdout.strip()


def build_image(libs: Path, tag: str = DEFAULT_TAG, *, docker: str = "docker") -> str:
    """Make the image ``tag`` from the jars in ``libs`` (``docker import``); returns its recipe hash."""
    if shutil.which(docker) is None:
        raise ImageBuildError(f"no '{docker}' command (Debian: apt-get install docker.io)")
    jre = java_home()
    busybox = static_busybox()
    hashed = recipe(libs, jre)
    changes = [
        f"ENV JAVA_HOME={JAVA_HOME}",
        f"ENV PATH={JAVA_HOME}/bin:/opt/kafka/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "USER appuser",
        "WORKDIR /",
        "EXPOSE 9092",
        f"LABEL {RECIPE_LABEL}={hashed}",
        'CMD ["/etc/kafka/docker/run"]',
    ]
    command = [docker, "import", *(arg for change in changes for arg in ("--change", change)), "-", tag]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
        assert process.stdin is not None
        try:
            with tarfile.open(fileobj=process.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                _write_rootfs(tar, libs, jre, busybox)
        except BrokenPipeError:
            pass  # docker import stopped reading: its own message below says why
        finally:
            process.stdin.close()
        code = process.wait(timeout=300)
        errors.seek(0)
        message = errors.read().decode(errors="replace").strip()
    if code != 0:
        raise ImageBuildError(f"docker import {tag} failed (exit code {code}): {message}")
    return hashed


def ensure_image(libs: Path | None = None, tag: str = DEFAULT_TAG, *, docker: str = "docker",
                 force: bool = False) -> Built:
    """The image ``tag``, built unless one with the same recipe exists (``force``: always).

    ``libs`` defaults to the reference release's jars, as ``KafkaBroker`` keeps them (downloading
    them from Maven Central once)."""
    if libs is None:
        from asyncconsumer.testing.kafka import kafka_libs

        libs = kafka_libs()
    began = time.monotonic()
    wanted = recipe(libs)
    if not force and image_recipe(tag, docker=docker) == wanted:
        return Built(tag, wanted, built=False, seconds=time.monotonic() - began)
    built = build_image(libs, tag, docker=docker)
    return Built(tag, built, built=True, seconds=time.monotonic() - began)
