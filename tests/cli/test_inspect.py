"""`deviceshare inspect` shows what the API says each group holds, per node and device.

The operator places known groups on a sandbox; the command's output is then compared with the
groups' statuses and the nodes' inventories read straight from the API.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from deviceshare import cli
from deviceshare.cli import inspect
from deviceshare.sandbox import Sandbox
from tests import kubeconfigs
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"


async def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


async def _place_known_groups(kube: Kube) -> list[dict[str, Any]]:
    """trainer (2 GPUs, 2 members), solo (1 GPU, 1 member), huge (never fits): placed by the operator."""
    await kube.create_group("ml", "trainer", {GPU: 2})
    await kube.create_group("ml", "solo", {GPU: 1})
    await kube.create_group("ml", "huge", {GPU: 64})
    for pod, group in [("trainer-0", "trainer"), ("evaluator-0", "trainer"), ("solo-0", "solo"), ("big-0", "huge")]:
        await kube.create_pod("ml", pod, group)
    for pod in ("trainer-0", "evaluator-0", "solo-0"):
        await kube.wait_bound("ml", pod)
    for group, members in [("trainer", 2), ("solo", 1)]:
        await kube.wait_group("ml", group, lambda g, n=members: len((g.get("status") or {}).get("members") or []) == n,
                              f"{members} members")
    return await kube.groups()


async def test_json_output_matches_the_api(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = await _place_known_groups(kube)
    rc, out, _ = await _main(capsys, "inspect", "--kubeconfig", str(cluster.kubeconfig), "-o", "json")
    assert rc == 0
    shown = json.loads(out)
    nodes = {n["name"]: n for n in shown["nodes"]}
    api_nodes = (await kube._json(kube.core.list_node(_preload_content=False)))["items"]
    assert set(nodes) == {n["metadata"]["name"] for n in api_nodes}

    # Every device the API says a group holds is shown held by exactly that group, with its members.
    expected_holder: dict[tuple[str, str], str] = {}
    for g in groups:
        status = g.get("status") or {}
        if not status.get("nodeName"):
            assert g["metadata"]["name"] == "huge"
            continue
        for device in status["allocatedDevices"][GPU]:
            expected_holder[(status["nodeName"], device)] = g["metadata"]["name"]
            entry = next(d for d in nodes[status["nodeName"]]["resources"][GPU]["devices"] if d["id"] == device)
            assert [x["name"] for x in entry["groups"]] == [g["metadata"]["name"]]
            assert entry["groups"][0]["members"] == status["members"]
    assert len(expected_holder) == 3

    # ...and every other device is free; totals come from the node's allocatable.
    for api_node in api_nodes:
        name = api_node["metadata"]["name"]
        res = nodes[name]["resources"][GPU]
        assert res["total"] == int(api_node["status"]["allocatable"][GPU])
        held = {d for (n, d) in expected_holder if n == name}
        assert res["allocated"] == len(held)
        assert set(res["free"]) == {d["id"] for d in res["devices"]} - held
        assert all(not d["groups"] for d in res["devices"] if d["id"] not in held)
    assert shown["conflicts"] == []


async def test_table_lists_each_device_and_a_summary_per_node(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = await _place_known_groups(kube)
    trainer = next(g for g in groups if g["metadata"]["name"] == "trainer")["status"]
    node = trainer["nodeName"]
    rc, out, _ = await _main(capsys, "inspect", "--kubeconfig", str(cluster.kubeconfig), "--node", node)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "RESOURCE", "DEVICE", "GROUP", "SHARE", "MEMBERS", "LEFT", "NOTE"]
    rows = [line.split() for line in lines[1:] if line.startswith(node + " ")]
    assert {r[0] for r in rows} == {node}
    held = {r[2]: r for r in rows if r[3] != inspect.FREE}
    for device in trainer["allocatedDevices"][GPU]:
        assert held[device][3:5] == ["ml/trainer", "whole"]
        assert sorted(held[device][5].split(",")) == sorted(trainer["members"])
    free_rows = [r for r in rows if r[3] == inspect.FREE]
    assert len(rows) == 8 and len(free_rows) == 8 - len(held)
    assert f"{node}: {GPU} {len(held)}/8 allocated" in lines


async def test_kubeconfig_from_the_environment_and_unknown_node(
    cluster: Sandbox, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    rc, out, _ = await _main(capsys, "inspect", "--node", "gpu-node-2", "-o", "json")
    assert rc == 0
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["gpu-node-2"]
    rc, _, err = await _main(capsys, "inspect", "--node", "no-such-node")
    assert rc == 1 and "no-such-node" in err


async def test_with_two_kubeconfig_files_the_first_current_context_is_the_cluster(
    cluster: Sandbox, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """KUBECONFIG=a:b, both setting a current context: kubectl reads a's (b's server does not answer)."""
    monkeypatch.setenv("KUBECONFIG", kubeconfigs.first_of_two(cluster.kubeconfig, tmp_path))
    rc, out, err = await _main(capsys, "inspect", "--node", "gpu-node-2", "-o", "json")
    assert (rc, err) == (0, "")
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["gpu-node-2"]


def _node(name: str, gpus: int, *, shared: bool = True, devices: list[str] | None = None) -> dict[str, Any]:
    labels = {"deviceshare.io/mode": "shared"} if shared else {}
    annotations = {"deviceshare.io/devices": json.dumps({GPU: devices})} if devices else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {"allocatable": {GPU: str(gpus), "cpu": "8", "memory": "8Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _group(name: str, node: str | None, ids: list[str], members: list[str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Bound" if node else "Pending", "members": members or []}
    if node:
        status |= {"nodeName": node, "allocatedDevices": {GPU: ids}}
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"resources": {GPU: len(ids)}}, "status": status}


@pytest.mark.parametrize(("nodes", "groups", "expect"), [
    pytest.param([_node("a", 2)], [], {"a": {"0": [], "1": []}}, id="all-free"),
    pytest.param([_node("a", 2)], [_group("g", "a", ["1"])], {"a": {"0": [], "1": ["ns/g"]}}, id="one-held"),
    pytest.param([_node("a", 2)], [_group("g", "a", ["1"]), _group("h", "a", ["1"])],
                 {"a": {"0": [], "1": ["ns/g", "ns/h"]}}, id="conflict"),
    pytest.param([_node("a", 0, devices=["GPU-x", "GPU-y"])], [_group("g", "a", ["GPU-y"])],
                 {"a": {"GPU-x": [], "GPU-y": ["ns/g"]}}, id="annotated-ids"),
    pytest.param([_node("a", 1)], [_group("g", "a", ["7"])], {"a": {"0": [], "7": ["ns/g"]}}, id="not-in-inventory"),
    pytest.param([_node("a", 1, shared=False)], [], {}, id="non-shared-hidden"),
    pytest.param([], [_group("g", "gone", ["0"])], {"gone": {"0": ["ns/g"]}}, id="node-deleted"),
    pytest.param([_node("a", 1)], [_group("g", None, [])], {"a": {"0": []}}, id="pending-holds-nothing"),
])
def test_device_map_cases(
    nodes: list[dict[str, Any]], groups: list[dict[str, Any]], expect: dict[str, dict[str, list[str]]]
) -> None:
    shown = inspect.device_map(nodes, groups)
    assert {n.name: {d.id: [h.ref for h in d.holders] for d in n.resources.get(GPU, ())} for n in shown} == expect
    as_json = inspect.to_json(shown)
    conflicts = {(c["node"], c["device"]) for c in as_json["conflicts"]}
    assert conflicts == {(n, d) for n, ds in expect.items() for d, hs in ds.items() if len(hs) > 1}
    for n in shown:
        for d in n.resources.get(GPU, ()):
            assert d.in_inventory == (d.id not in {"7"} and n.exists)


def test_table_flags_conflicts(capsys: pytest.CaptureFixture[str]) -> None:
    shown = inspect.device_map([_node("a", 2)], [_group("g", "a", ["1"], ["p"]), _group("h", "a", ["1"], ["q"])])
    inspect.render_table(shown, sys.stdout)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("a ") and " 1 " in line]
    assert [r[3:] for r in rows] == [["ns/g", "whole", "p", "-", inspect.CONFLICT],
                                      ["ns/h", "whole", "q", "-", inspect.CONFLICT]]
    assert "a: nvidia.com/gpu 1/2 allocated" in out


def _sharer(name: str, ids: list[str], share: dict[str, Any], resource: str = GPU,
            tiles: list[str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Bound", "members": [f"{name}-0"], "nodeName": "a",
                              "allocatedDevices": {resource: ids}}
    if tiles:
        status["allocatedTiles"] = {resource: tiles}
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"resources": {resource: len(ids)}, "share": {resource: share}}, "status": status}


def _with_memory(node: dict[str, Any], mib: int) -> dict[str, Any]:
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = str(mib)
    return node


def test_a_shared_device_lists_each_holder_with_its_share_and_what_is_left(
    capsys: pytest.CaptureFixture[str]
) -> None:
    groups = [_sharer("llm", ["0"], {"memory": "24Gi", "compute": "460m"}), _sharer("asr", ["0"], {"memory": "8Gi"})]
    shown = inspect.device_map([_with_memory(_node("a", 2), 81920)], groups)
    inspect.render_table(shown, sys.stdout)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("a ")]
    assert rows[0][2:] == ["0", "ns/asr", "memory=8Gi", "asr-0", "compute=540m,memory=48Gi"]
    assert rows[1][2:] == ["0", "ns/llm", "compute=460m,memory=24Gi", "llm-0", "compute=540m,memory=48Gi"]
    assert rows[2][2:] == ["1", "-", "-", "-", "-"]
    device = inspect.to_json(shown)["nodes"][0]["resources"][GPU]["devices"][0]
    assert device["left"] == {"compute": "540m", "memory": "48Gi"} and not device["conflict"]
    assert [g["share"] for g in device["groups"]] == [{"memory": "8Gi"}, {"compute": "460m", "memory": "24Gi"}]


@pytest.mark.parametrize(("groups", "problem"), [
    pytest.param([_sharer("x", ["0"], {"memory": "50Gi"}), _sharer("y", ["0"], {"memory": "40Gi"})],
                 "memory 90Gi given out, more than the device's 80Gi", id="memory"),
    pytest.param([_sharer("x", ["0"], {"compute": "0.7"}), _sharer("y", ["0"], {"compute": "400m"})],
                 "compute 1100m given out, more than 1", id="compute"),
    pytest.param([_group("w", "a", ["0"]), _sharer("y", ["0"], {"compute": "400m"})],
                 "used both whole and in parts", id="whole-and-shared"),
])
def test_an_overcommitted_device_is_a_conflict_that_says_why(groups: list[dict[str, Any]], problem: str) -> None:
    as_json = inspect.to_json(inspect.device_map([_with_memory(_node("a", 1), 81920)], groups))
    device = as_json["nodes"][0]["resources"][GPU]["devices"][0]
    assert device["conflict"] and device["problem"] == problem
    assert [c["device"] for c in as_json["conflicts"]] == ["0"]


def test_tiles_of_a_card_are_listed_per_holder() -> None:
    intel = "gpu.intel.com/i915"
    node = {"metadata": {"name": "a", "labels": {"deviceshare.io/mode": "shared", "gpu.intel.com/tiles": "4"}},
            "status": {"allocatable": {intel: "2"}, "conditions": [{"type": "Ready", "status": "True"}]}}
    groups = [_sharer("enc", ["0"], {"tiles": 1}, intel, ["0.1"]), _sharer("dec", ["0"], {"tiles": 1}, intel, ["0.0"])]
    (shown,) = inspect.device_map([node], groups)
    card = shown.resources[intel][0]
    assert [h.describe_share() for h in card.holders] == ["tiles=1:0", "tiles=1:1"]
    assert card.left() == {"tiles": 0} and not card.conflict


@pytest.mark.skipif(not os.path.exists("/usr/bin/kubectl") and not any(
    os.path.exists(os.path.join(p, "kubectl")) for p in os.environ.get("PATH", "").split(os.pathsep)),
    reason="kubectl not installed")
async def test_works_as_a_kubectl_plugin(cluster: Sandbox, tmp_path: Path) -> None:
    # What `pip install` puts on PATH for the console script, pointed at this checkout.
    plugin = tmp_path / "kubectl-deviceshare"
    plugin.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.path.insert(0, {str(ROOT / "src")!r})
        from deviceshare.cli import main
        sys.exit(main())
        """))
    plugin.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "deviceshare", "inspect", "--kubeconfig", str(cluster.kubeconfig), "-o", "json",
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert sorted(n["name"] for n in json.loads(out)["nodes"]) == [f"gpu-node-{i}" for i in range(4)]


def test_the_plugin_entry_point_is_declared() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-deviceshare"] == scripts["deviceshare"] == "deviceshare.cli:main"
