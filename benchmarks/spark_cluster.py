"""A Spark standalone cluster from the installed PySpark: one master and N workers on loopback.

    with StandaloneCluster(workers=2, cores=1, memory_mb=1536, work_dir=d) as cluster:
        SparkSession.builder.master(cluster.url)...

Each daemon is ``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``
(``spark-class`` execs the JVM, so the pid we hold is the daemon's), started on free ports with its
log in ``work_dir``, and stopped by that pid (SIGTERM, then SIGKILL after 20 s).  ``start()`` waits
until the master's JSON status page lists every worker ALIVE.  Executors run the Python workers with
this interpreter (``PYSPARK_PYTHON``), so they import the same asyncconsumer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from asyncconsumer.testing.broker import free_port


class SparkClusterError(RuntimeError):
    """The standalone cluster did not come up (the message names the daemon and its log's tail)."""


def spark_home() -> Path:
    """The installed PySpark's directory: its ``bin/spark-class`` and jars make a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    def __init__(self, work_dir: str | Path, workers: int = 2, cores: int = 1, memory_mb: int = 1536,
                 startup_timeout: float = 120.0) -> None:
        self.work_dir = Path(work_dir)
        self.workers, self.cores, self.memory_mb = workers, cores, memory_mb
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.web_port = free_port()
        self._procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        """The master URL for ``SparkSession.builder.master()``."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [proc.pid for _, proc, _ in self._procs]

    def _env(self) -> dict[str, str]:
        home = spark_home()
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.work_dir / "local"),
            SPARK_WORKER_DIR=str(self.work_dir / "worker"),
            SPARK_LOG_DIR=str(self.work_dir / "logs"),
            SPARK_NO_DAEMONIZE="1",
            PYSPARK_PYTHON=sys.executable,
            SPARK_DAEMON_MEMORY="512m",
        )
        return env

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = self.work_dir / f"{name}.log"
        out = open(log, "wb")  # closed in stop()
        self._logs.append(out)
        command = [str(spark_home() / "bin" / "spark-class"), main_class, *args]
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self._env(), cwd=self.work_dir)
        self._procs.append((name, proc, log))

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, their state and cores)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as response:
            status: dict[str, Any] = json.load(response)
            return status

    def start(self) -> StandaloneCluster:
        for sub in ("local", "worker", "logs"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(self.port), "--webui-port", str(self.web_port))
            for i in range(self.workers):
                self._spawn(f"worker-{i + 1}", "org.apache.spark.deploy.worker.Worker", self.url,
                            "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", f"{self.memory_mb}m",
                            "--webui-port", str(free_port()), "--work-dir", str(self.work_dir / "worker"))
            self._wait_alive()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_alive(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        alive = 0
        while time.monotonic() < deadline:
            for name, proc, log in self._procs:
                if proc.poll() is not None:
                    raise SparkClusterError(f"Spark {name} exited with {proc.returncode}: {_tail(log)}")
            try:
                alive = sum(w.get("state") == "ALIVE" for w in self.status().get("workers", []))
            except OSError:
                alive = 0
            if alive >= self.workers:
                return
            time.sleep(0.5)
        raise SparkClusterError(f"{alive} of {self.workers} Spark workers alive after {self.startup_timeout:.0f} s; "
                                f"master log: {_tail(self._procs[0][2])}")

    def stop(self) -> None:
        """Stop the workers, then the master, each by its own pid."""
        for _, proc, _ in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in reversed(self._procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._procs.clear()
        for out in self._logs:
            out.close()
        self._logs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _tail(path: Path, chars: int = 800) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"(no log: {exc})"
