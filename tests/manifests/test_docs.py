"""The docs stay true: relative links resolve, and the Argo CD health check in docs/argocd.md runs.

The Lua is executed as Argo CD would (``obj`` bound to the resource, the returned table read for
``status``/``message``) with ``lupa``; the test is skipped if lupa is not installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
GENERATED = {"benchmarks.md", "reliability.md"}  # written elsewhere; may be absent in a checkout


def _anchor(heading: str) -> str:
    """GitHub's heading anchors: lower-case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if linked.name in GENERATED:
            continue
        assert linked.exists(), f"{page.name}: broken link {target}"
        if anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name}: no heading for #{anchor}"


def test_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for page in DOCS:
        if page.name != "README.md":
            assert page.name in index, page.name


def _health_check() -> Any:
    lupa = pytest.importorskip("lupa")
    text = (ROOT / "docs" / "argocd.md").read_text()
    (script,) = re.findall(r"```lua\n(.*?)```", text, flags=re.S)
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
    check = runtime.eval(f"function(obj)\n{script}\nend")

    def run(obj: dict[str, Any]) -> tuple[str, str]:
        result = check(runtime.table_from(obj, recursive=True))
        return str(result["status"]), str(result["message"])

    return run


def _group(phase: str | None = None, *, generation: int = 1, observed: int | None = 1,
           conditions: list[dict[str, str]] | None = None, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
                           "metadata": {"name": "g", "namespace": "ml", "generation": generation}}
    if phase is not None:
        obj["status"] = {"phase": phase, "conditions": conditions or [], **status}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


UNSCHEDULABLE = {"type": "Scheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 insufficient nvidia.com/gpu."}


@pytest.mark.parametrize(("group", "health", "message_has"), [
    (_group(), "Progressing", "operator"),
    (_group("Pending", conditions=[UNSCHEDULABLE]), "Progressing", "0/3 nodes are available"),
    (_group("Pending"), "Progressing", "free devices"),
    (_group("Bound", nodeName="gpu-1", allocatedDevices={"nvidia.com/gpu": ["0", "1"]}, memberCount=2,
            conditions=[{"type": "Scheduled", "status": "True", "reason": "Bound"}]),
     "Healthy", "gpu-1 (nvidia.com/gpu=0,1), 2 member"),
    (_group("Bound", generation=2, observed=1, nodeName="gpu-1"), "Progressing", "latest spec"),
    (_group("Bound", observed=None, nodeName="gpu-1"), "Healthy", "gpu-1"),
    (_group("Releasing", nodeName="gpu-1"), "Progressing", "Releasing"),
    (_group("Bound", nodeName="gpu-1", conditions=[
        {"type": "NodeLost", "status": "True", "message": "node gpu-1 is gone"}]),
     "Degraded", "gpu-1 is gone"),
    (_group("Bound", nodeName="gpu-1", conditions=[
        {"type": "DeviceConflict", "status": "False", "message": "ok"}]), "Healthy", "gpu-1"),
])
def test_argocd_health_check(group: dict[str, Any], health: str, message_has: str) -> None:
    status, message = _health_check()(group)
    assert status == health
    assert message_has in message
