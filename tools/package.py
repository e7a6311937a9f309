"""Build the release artifacts and prove them outside the checkout (``./dev nox -s package``).

1. ``python -m build --sdist``: the source distribution.
2. One wheel per CPython 3.11-3.13 found on the machine, each built *from that sdist* (so the sdist
   is shown complete), repaired to a ``manylinux`` tag by ``auditwheel repair`` and shown by
   ``auditwheel show``.
3. Each wheel installed into a clean venv in a temporary directory, first alone (the declared
   dependencies only), then with the ``arrow`` and ``testing`` extras, running
   ``tools/smoke_install.py`` there (docs/installing.md says what it checks): the compiled decoder.
4. The sdist installed the same way with no compiler on ``PATH``: the pure-Python decoder.

The artifacts are left in ``dist/``.  ``--python VERSION`` (repeatable) limits step 2 to those
versions; ``--no-extras`` skips the consume stage (no broker, no pyarrow download).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
SMOKE = ROOT / "tools" / "smoke_install.py"
VERSIONS = ("3.11", "3.12", "3.13")
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def log(message: str) -> None:
    print(f"package: {message}", flush=True)


def run(*command: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a command; its output is printed, and returned."""
    result = subprocess.run([str(c) for c in command], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print(result.stdout, end="", flush=True)
    if result.returncode != 0:
        raise SystemExit(f"package: failed ({result.returncode}): {' '.join(map(str, command))}")
    return result.stdout


def interpreter(version: str) -> Path | None:
    """A CPython ``version`` interpreter: this one, one on PATH that really runs, or pyenv's."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return Path(sys.executable)
    pyenv = sorted(glob.glob(str(PYENV / f"{version}.*" / "bin" / "python3")))
    candidates = [shutil.which(f"python{version}"), *pyenv]
    for candidate in candidates:
        if candidate is None:
            continue
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(int(p) for p in version.split("."))):
            return Path(candidate)
    return None


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: nothing from the developer's venv, the checkout or a compiler setting."""
    env = {key: os.environ[key] for key in ("HOME", "LANG", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                                            "PIP_CACHE_DIR", "SSL_CERT_FILE") if key in os.environ}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def build(versions: tuple[str, ...]) -> tuple[Path, list[tuple[str, Path, Path]]]:
    shutil.rmtree(DIST, ignore_errors=True)
    run(sys.executable, "-m", "build", "--sdist", "--outdir", DIST, ROOT)
    (sdist,) = DIST.glob("asyncconsumer-*.tar.gz")
    raw = DIST / "raw"
    wheels = []
    for version in versions:
        python = interpreter(version)
        if python is None:
            log(f"CPython {version}: not found on this machine, no wheel built for it")
            continue
        log(f"CPython {version}: building a wheel from {sdist.name} with {python}")
        before = set(raw.glob("*.whl"))
        env = clean_env(PATH=os.environ["PATH"])
        run(python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", raw, sdist, env=env)
        (built,) = set(raw.glob("*.whl")) - before
        run(sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", DIST, built)
        (repaired,) = DIST.glob(built.name.split("-linux_")[0] + "-*manylinux*.whl")
        run(sys.executable, "-m", "auditwheel", "show", repaired)
        log(f"{repaired.name}: {repaired.stat().st_size / 1024:.0f} KiB")
        wheels.append((version, python, repaired))
    shutil.rmtree(raw, ignore_errors=True)
    if not wheels:
        raise SystemExit("package: no wheel was built")
    return sdist, wheels


def smoke(python: Path, artifact: Path, decoder: str, extras: bool, *, no_compiler: bool = False) -> None:
    """Install ``artifact`` into a new venv outside the checkout and run the smoke test there."""
    with tempfile.TemporaryDirectory(prefix="asyncconsumer-smoke-") as tmp:
        where = Path(tmp)
        run(python, "-m", "venv", where / "venv")
        bin_dir = where / "venv" / "bin"
        # No compiler: PATH holds the venv's own bin only (gcc, cc, ld are not on it) and CC is unset.
        path = str(bin_dir) if no_compiler else f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        env = clean_env(PATH=path, VIRTUAL_ENV=str(where / "venv"))
        if no_compiler:
            assert shutil.which("gcc", path=path) is None and shutil.which("cc", path=path) is None
        script = shutil.copy(SMOKE, where / SMOKE.name)
        pip = [bin_dir / "python", "-m", "pip", "install", "-q"]
        run(*pip, artifact, env=env, cwd=where)
        run(bin_dir / "python", script, "bare", "--decoder", decoder, "--checkout", ROOT, env=env, cwd=where)
        if extras:
            run(*pip, f"asyncconsumer[arrow,testing] @ {artifact.as_uri()}", env=env, cwd=where)
            run(bin_dir / "python", script, "full", "--decoder", decoder, "--checkout", ROOT, env=env, cwd=where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", choices=VERSIONS, help="build wheels for these versions only")
    parser.add_argument("--no-extras", action="store_true", help="skip the consume stage")
    args = parser.parse_args()
    started = time.monotonic()
    sdist, wheels = build(tuple(args.python or VERSIONS))
    log(f"{sdist.name}: {sdist.stat().st_size / 1024:.0f} KiB")
    for version, python, wheel in wheels:
        log(f"smoke test: {wheel.name} on CPython {version}")
        smoke(python, wheel, "c", not args.no_extras)
    log(f"smoke test: {sdist.name}, no compiler on PATH")
    smoke(Path(sys.executable), sdist, "python", not args.no_extras, no_compiler=True)
    built = ", ".join(v for v, _, _ in wheels)
    log(f"done in {time.monotonic() - started:.0f} s: the sdist and wheels for CPython {built} in {DIST}")


if __name__ == "__main__":
    main()
