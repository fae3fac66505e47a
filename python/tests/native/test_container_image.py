"""deploy/container: the Manager image built from this repository with its one command and
run the way docs/operations.md (Containers) says: a Manager container as a non-root uid,
an engine-side container of the same uid sharing its socket volume and pid namespace
restores byte-exact, one that does not share the pid namespace is refused with the fix,
and `docker stop` ends the Manager cleanly.

Runs a private Docker daemon (its own data root and socket, no network) and builds the
base with debootstrap (no registry needed); root only. scripts/test.sh installs docker.io
and debootstrap and sets ORBITKV_REQUIRE_CONTAINER=1, which turns a skip into a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitkv.launch import stop_process

pytestmark = pytest.mark.native

REPO = Path(__file__).resolve().parents[3]
TAG = "orbitkv-manager:test"
CLIENT = """
import os
from orbitkv import _native
with _native.Client(os.environ["ORBITKV_SOCKET"]) as c:
    ns = c.register_namespace(b"c" * 32, 65536)
    hashes = [os.urandom(32) for _ in range(8)]
    data = os.urandom(8 * 65536)
    assert c.save(ns, hashes, data).stored == 8
    with c.lookup(ns, hashes) as lease:
        out = bytearray(len(data))
        c.restore(lease, out)
    assert out == data and lease.hit_blocks == 8
    print("restored 8 blocks byte-exact as uid", os.getuid())
"""


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a private Docker daemon and debootstrap need root"
    missing = [c for c in ("dockerd", "docker", "debootstrap") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/test.sh installs docker.io and debootstrap as root)"
    if not list((REPO / "target" / "wheels").glob("orbitkv-*.whl")) and not os.environ.get("ORBITKV_WHEEL"):
        return "no orbitkv wheel under target/wheels (scripts/test.sh builds it first)"
    return None


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("ORBITKV_REQUIRE_CONTAINER") == "1":
            pytest.fail(f"ORBITKV_REQUIRE_CONTAINER=1 but {reason}")
        pytest.skip(reason)
    # On the disk, not /tmp: overlay2 needs a filesystem that supports it.
    state = Path(tempfile.mkdtemp(prefix="orbitkv-dockerd-", dir=REPO / "target"))
    sock = state / "docker.sock"
    log = open(state / "dockerd.log", "wb")
    daemon = subprocess.Popen(
        [
            "dockerd", "--data-root", str(state / "data"), "--exec-root", str(state / "exec"),
            "--pidfile", str(state / "dockerd.pid"), "--host", f"unix://{sock}",
            "--iptables=false", "--bridge=none",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}"}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                text = (state / "dockerd.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"the private dockerd did not start:\n{text}")
            time.sleep(0.5)
        yield env
    finally:
        subprocess.run(["docker", "rm", "-f", "okv-m"], env=env, capture_output=True)
        stop_process(daemon, timeout_s=60)
        log.close()
        subprocess.run(["umount", "-R", str(state / "data")], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


def docker(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr}"
    return r


def test_the_image_builds_with_one_command_and_serves_engines_sharing_its_pid_namespace(
    docker_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**docker_env, "ORBITKV_IMAGE_CACHE": os.environ.get("ORBITKV_IMAGE_CACHE", str(REPO / ".cache" / "images"))}
    if "ORBITKV_WHEEL" not in env:
        env["ORBITKV_WHEEL"] = str(sorted((REPO / "target" / "wheels").glob("orbitkv-*.whl"))[-1])
    r = subprocess.run(
        [str(REPO / "deploy" / "container" / "build.sh"), "--debian-base", "--tag", TAG],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == TAG
    assert docker(env, "image", "inspect", TAG, "--format", "{{.Config.User}}").stdout.strip() == "1000:1000"

    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    docker(env, "volume", "create", "okv-sock")
    try:
        docker(
            env, "run", "-d", "--name", "okv-m", "--network", "none", "-v", "okv-sock:/run/orbitkv",
            "-e", "ORBITKV_DRAM_SIZE=64MiB", TAG,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while "serving on /run/orbitkv/socket/manager.sock" not in docker(env, "logs", "okv-m").stderr:
            assert time.monotonic() < deadline, docker(env, "logs", "okv-m").stderr
            time.sleep(0.2)
        assert docker(env, "exec", "okv-m", "id", "-u").stdout.strip() == "1000"
        mode = docker(env, "exec", "okv-m", "stat", "-c", "%a %u", "/run/orbitkv/socket").stdout.split()
        assert mode == ["700", "1000"]

        run = ["run", "--rm", "--network", "none", "-v", "okv-sock:/run/orbitkv", "-v", f"{client}:/client.py:ro"]
        shared = docker(env, *run, "--pid", "container:okv-m", "--entrypoint", "python3", TAG, "/client.py")
        assert shared.stdout.strip() == "restored 8 blocks byte-exact as uid 1000"

        apart = docker(env, *run, "--entrypoint", "python3", TAG, "/client.py", check=False)
        assert apart.returncode != 0
        assert "not visible in the Manager's pid namespace" in apart.stderr
        assert "--pid container:<manager>" in apart.stderr

        docker(env, "stop", "okv-m")
        assert docker(env, "inspect", "okv-m", "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
        assert "stopped" in docker(env, "logs", "okv-m").stderr
    finally:
        docker(env, "rm", "-f", "okv-m", check=False)
        docker(env, "volume", "rm", "okv-sock", check=False)


def test_the_build_script_refuses_bad_input_before_building(tmp_path: Path) -> None:
    script = str(REPO / "deploy" / "container" / "build.sh")
    bogus = tmp_path / "not-a-wheel.whl"
    bogus.write_text("x")
    engine = {**os.environ, "CONTAINER_ENGINE": "true"}  # a present command: only the inputs are checked
    r = subprocess.run([script, "--uid", "0", "--check"], capture_output=True, text=True, env=engine)
    assert r.returncode == 2 and "--uid 0 must be a positive number (the image never runs as root)" in r.stderr
    r = subprocess.run([script, "--check"], capture_output=True, text=True, env={**engine, "ORBITKV_WHEEL": str(bogus)})
    assert r.returncode == 2 and "is not an orbitkv abi3 Linux wheel" in r.stderr
    r = subprocess.run([script, "--bogus"], capture_output=True, text=True, env=engine)
    assert r.returncode == 2 and "unknown argument --bogus" in r.stderr
    r = subprocess.run(
        [script, "--check"], capture_output=True, text=True, env={**os.environ, "CONTAINER_ENGINE": "no-such-engine"}
    )
    assert r.returncode == 2 and "CONTAINER_ENGINE=no-such-engine is not on PATH" in r.stderr
