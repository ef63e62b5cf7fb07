"""The pod ``binding`` subresource carries annotations, as kube-apiserver's ``BindingREST`` does.

The operator relies on it to annotate and bind a pod in one write: the Binding's ``metadata.annotations``
land on the pod together with ``spec.nodeName`` (existing annotations kept, the same keys overwritten), in a
single resourceVersion that a watcher sees as one event; a refused binding changes nothing.
"""

from __future__ import annotations

import asyncio

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import PODS, Http, pod


def binding(name: str, node: str, annotations: dict[str, str], uid: str | None = None) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "annotations": annotations}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


async def test_binding_annotations_land_with_the_node_in_one_write(sandbox: Sandbox, http: Http) -> None:
    status, created = await http.call("POST", PODS, pod("p", metadata={"annotations": {"keep": "1", "env": "all"}}))
    assert status == 201
    rv = created["metadata"]["resourceVersion"]
    # From rv: the change comes whether the watch opens before the binding or after it.
    watch = asyncio.ensure_future(http.watch(PODS, {"resourceVersion": rv, "timeoutSeconds": "60"}, limit=1))
    status, _ = await http.call("POST", f"{PODS}/p/binding", binding("p", "gpu-node-1", {"env": "0,1", "new": "x"}))
    assert status == 201
    events = await watch
    first = events[0]["object"]
    # The first change any watcher sees has both: no moment bound without the annotations, or the reverse.
    assert first["spec"]["nodeName"] == "gpu-node-1"
    assert first["metadata"]["annotations"] == {"keep": "1", "env": "0,1", "new": "x"}
    assert int(first["metadata"]["resourceVersion"]) > int(rv)


async def test_a_refused_binding_changes_no_annotation(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", PODS, pod("p", metadata={"annotations": {"env": "0"}}))
    status, _ = await http.call("POST", f"{PODS}/p/binding", binding("p", "gpu-node-1", {"env": "all"}, uid="other"))
    assert status == 409  # another uid: the precondition fails
    assert sandbox.get("pods", "p", "default")["metadata"]["annotations"] == {"env": "0"}
    assert not sandbox.get("pods", "p", "default")["spec"].get("nodeName")
