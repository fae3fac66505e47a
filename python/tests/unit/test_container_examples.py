"""deploy/container's compose and Kubernetes examples agree with the image they run
(the Containerfile's uid and socket path) and with what the Manager needs from its
engines: the same uid, one pid namespace, the socket volume, memlock for GPU pinning,
a memory limit that holds the arena. The image itself is built and run in
python/tests/native/test_container_image.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parents[3] / "deploy" / "container"
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "MiB": 1 << 20, "GiB": 1 << 30, "g": 1 << 30, "m": 1 << 20}


def bytes_of(v: str) -> int:
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", v)
    assert m, v
    return int(m.group(1)) * UNITS[m.group(2)]


def image() -> dict[str, str]:
    text = (HERE / "Containerfile").read_text()
    uid = re.search(r"^ARG UID=(\d+)$", text, re.M)
    user = re.search(r"^USER (\S+)$", text, re.M)
    sock = re.search(r"ORBITKV_SOCKET=(\S+)", text)
    volume = re.search(r'^VOLUME \["(\S+)"\]$', text, re.M)
    assert uid and user and sock and volume
    assert user.group(1) == "${UID}:${UID}" and int(uid.group(1)) > 0, "the image never runs as root"
    assert sock.group(1).startswith(volume.group(1) + "/"), "the socket lives inside the shared volume"
    assert Path(sock.group(1)).parent != Path(volume.group(1)), "its own directory, so the volume's mode is free"
    return {"uid": uid.group(1), "socket": sock.group(1), "volume": volume.group(1)}


def socket_in(command: list[str]) -> str:
    cfg = json.loads(command[command.index("--kv-transfer-config") + 1])
    assert cfg["kv_connector"] == "OrbitKVConnector" and cfg["kv_connector_module_path"] == "orbitkv.vllm"
    return str(cfg["kv_connector_extra_config"]["orbitkv.socket_path"])


def test_the_compose_example_gives_the_engine_what_the_manager_requires() -> None:
    img = image()
    svc: dict[str, Any] = yaml.safe_load((HERE / "compose.yaml").read_text())["services"]
    m, e = svc["orbitkv"], svc["vllm"]
    assert m["user"] == e["user"] == f"{img['uid']}:{img['uid']}"
    assert e["pid"] == "service:orbitkv"
    vol = f"orbitkv-socket:{img['volume']}"
    assert vol in m["volumes"] and vol in e["volumes"]
    assert socket_in(e["command"]) == img["socket"]
    assert e["ulimits"]["memlock"] == -1
    assert bytes_of(m["mem_limit"]) >= bytes_of(m["environment"]["ORBITKV_DRAM_SIZE"]) + (1 << 30)


def test_the_kubernetes_example_gives_the_engine_what_the_manager_requires() -> None:
    img = image()
    pod: dict[str, Any] = yaml.safe_load((HERE / "kubernetes.yaml").read_text())
    spec = pod["spec"]
    assert spec["shareProcessNamespace"] is True
    assert spec["securityContext"]["runAsUser"] == int(img["uid"]) and spec["securityContext"]["runAsNonRoot"]
    by = {c["name"]: c for c in spec["containers"]}
    m, e = by["orbitkv"], by["vllm"]
    for c in (m, e):
        assert {"name": "orbitkv-socket", "mountPath": img["volume"]} in c["volumeMounts"]
        assert "runAsUser" not in c.get("securityContext", {}), "one uid for the pod"
    assert socket_in(e["command"]) == img["socket"]
    dram = bytes_of(next(v["value"] for v in m["env"] if v["name"] == "ORBITKV_DRAM_SIZE"))
    assert bytes_of(m["resources"]["limits"]["memory"]) >= dram + (1 << 30)
    assert m["readinessProbe"]["exec"]["command"] == ["python3", "-m", "orbitkv", "status", "--json"]
