"""A Docker engine for the tests that run the compose demo in containers
(tests/e2e/test_compose_engine.py, ``make compose-test``).

* :func:`docker_engine` uses the engine that answers ``docker info``, or starts ``dockerd``
  (in the background, its pid in :data:`CACHE`, ready once it logs that its API listens)
  and stops it at the end; :class:`NoEngine` says why neither can be had.
* :func:`base_image` is the Dockerfile's base: ``python:3.11-slim`` when the engine has it
  or can pull it, else a local stand-in: a minimal Debian bookworm root filesystem with
  its Python 3.11 made by ``mmdebstrap`` and ``docker import``-ed, cached in
  :data:`CACHE` (the tarball) and in the engine (the image) between runs.
* :func:`composes` are the Compose commands installed: Compose 1.29's ``docker-compose``
  and v2's ``docker compose``.

Nothing here sleeps to wait: the daemon is waited for on its log line, bounded.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support import CompletedRun, LogLines, run_to_exit

DOCKER = shutil.which("docker")
#: what the engine tests keep between runs: the stand-in's tarball, dockerd's pid file
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "acp-router"
#: the base deploy/Dockerfile names (its ARG PYTHON_IMAGE), pulled where it can be
PULLED_BASE = "python:3.11-slim"
#: the local stand-in for it; the number changes when what goes into it does
STAND_IN = "acp-router-base:bookworm-1"
#: the stand-in's root filesystem: Debian's Python 3.11 (the slim image's version), a
#: ``python`` on PATH as in the slim image, and the CA certificates pip needs in the build
STAND_IN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: certificates this machine trusts beyond Debian's, which its egress to PyPI may need
LOCAL_CERTIFICATES = Path("/usr/local/share/ca-certificates")


class NoEngine(Exception):
    """No Docker engine answers here and none can be started: the message says why."""


async def docker(*args: str, timeout: float = 60) -> CompletedRun:
    if DOCKER is None:
        raise NoEngine("no docker command (Debian: apt-get install docker.io)")
    return await run_to_exit(DOCKER, *args, timeout=timeout)


def checked(run: CompletedRun, what: str) -> str:
    """The stdout of a run that must have succeeded; else an AssertionError with its output."""
    output = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, f"{what} failed (exit {run.returncode}):\n{output}"
    return run.stdout


async def _engine_answers() -> str | None:
    """None when ``docker info`` answers, else the first line of what it said."""
    info = await docker("info", "--format", "{{.ServerVersion}}")
    if info.returncode == 0:
        return None
    return (info.stderr.strip().splitlines() or ["no output"])[0]


@asynccontextmanager
async def docker_engine(start_timeout: float = 60) -> AsyncIterator[str]:
    """Yield a sentence naming the engine used: the running one, or a ``dockerd`` started
    here (stopped on exit).

    Raises:
        NoEngine: none answers, and this machine cannot start one (no dockerd, not root,
            or it did not come up).
    """
    said = await _engine_answers()
    if said is None:
        yield "the Docker engine already running"
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise NoEngine(f"no Docker engine answers ({said}) and dockerd is not installed")
    if os.geteuid() != 0:
        raise NoEngine(f"no Docker engine answers ({said}) and only root can start dockerd")
    CACHE.mkdir(parents=True, exist_ok=True)
    pidfile = CACHE / "dockerd.pid"
    process = await asyncio.create_subprocess_exec(
        dockerd, "--pidfile", str(pidfile),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert process.stderr is not None
    log = LogLines()
    drain = asyncio.create_task(log.drain(process.stderr))
    try:
        try:
            await log.wait_for("API listen on", start_timeout)
        except AssertionError as error:
            raise NoEngine(f"dockerd did not start: {str(error)[-2000:]}") from None
        yield f"dockerd {process.pid} started here (pid file {pidfile})"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        await drain


async def has_image(name: str) -> bool:
    return (await docker("image", "inspect", "--format", "{{.Id}}", name)).returncode == 0


async def base_image() -> str:
    """The base to build deploy/Dockerfile on: the pulled one where it can be had, else
    the stand-in (made, or imported from its cached tarball, when the engine lacks it)."""
    if await has_image(PULLED_BASE):
        return PULLED_BASE
    if (await docker("pull", "--quiet", PULLED_BASE, timeout=300)).returncode == 0:
        return PULLED_BASE
    if not await has_image(STAND_IN):
        tarball = await _stand_in_tarball()
        checked(
            await docker(
                "import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                "--change", 'CMD ["python"]', str(tarball), STAND_IN, timeout=300,
            ),
            f"docker import {tarball}",
        )  # fmt: skip
    return STAND_IN


async def _stand_in_tarball() -> Path:
    """The stand-in's root filesystem as a tarball in :data:`CACHE`, made when absent."""
    tarball = CACHE / f"{STAND_IN.replace(':', '-')}.tar"
    if tarball.exists():
        return tarball
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise NoEngine(
            f"{PULLED_BASE} cannot be pulled and mmdebstrap (to build a stand-in) is not"
            " installed (Debian: apt-get install mmdebstrap)"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    hooks = _stand_in_hooks()
    partial = tarball.with_suffix(".partial.tar")
    checked(
        await run_to_exit(
            mmdebstrap, "--quiet", "--variant=minbase", f"--include={','.join(STAND_IN_PACKAGES)}",
            *(f"--customize-hook={hook}" for hook in hooks),
            "bookworm", str(partial), timeout=600,
        ),
        "mmdebstrap (the stand-in base image)",
    )  # fmt: skip
    partial.rename(tarball)
    return tarball


def _stand_in_hooks() -> list[str]:
    """mmdebstrap's hooks: ``python`` on PATH, and this machine's own certificates."""
    hooks = ['ln -sf /usr/bin/python3 "$1/usr/local/bin/python"']
    if any(LOCAL_CERTIFICATES.glob("*.crt")):
        hooks += [
            f"copy-in {LOCAL_CERTIFICATES} {LOCAL_CERTIFICATES.parent}",
            'chroot "$1" update-ca-certificates',
        ]
    return hooks


async def composes() -> dict[str, Sequence[str]]:
    """The Compose commands installed, by name: Compose 1.29 and v2."""
    found: dict[str, Sequence[str]] = {}
    if (legacy := shutil.which("docker-compose")) is not None:
        found["Compose 1.29 (docker-compose)"] = (legacy,)
    if DOCKER is not None and (await docker("compose", "version")).returncode == 0:
        found["Compose v2 (docker compose)"] = (DOCKER, "compose")
    return found
