"""Answers that HTTP/1.1 frames in ways the operator's client once misread (issue 32), from the sandbox's faults:
an interim ``100 Continue`` before a refusal was taken for the answer (``{}``, a success), and a body cut short by
a close with no length was handed on as a JSON document (a raw decoding error escaped, and a placement's claim was
released although it had landed). Now the refusal is a refusal, and a cut answer is a lost one: read back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.kube import connecting
from deviceshare.operator import storage
from deviceshare.sandbox import Sandbox
from tests.reliability import workload

NS = "framing"
KEY = (NS, "g")
STATUS = rf"/namespaces/{NS}/{names.PLURAL}/g/status$"


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=1, gpus=2, kubeconfig_path=tmp_path / "kubeconfig") as sandbox:
        workload.ensure_namespace(sandbox, NS)
        sandbox.create(workload.group_body(NS, "g", {workload.GPU: 1}))
        yield sandbox


async def write_status(api: storage.ClusterApi, box: Sandbox, phase: str) -> Any:
    group = box.get(names.PLURAL, "g", NS)
    assert group is not None
    return await api.patch_group_status(KEY, {"phase": phase}, uid=group["metadata"]["uid"],
                                        resource_version=group["metadata"]["resourceVersion"])


async def test_a_100_continue_before_a_409_is_the_409(api: storage.ClusterApi, box: Sandbox) -> None:
    fault = box.inject_fault("PATCH", STATUS, status=409, interim=True, message="the object has been modified")
    with pytest.raises(storage.Conflict):
        await write_status(api, box, "Pending")
    assert fault.fired == 1
    assert (box.get(names.PLURAL, "g", NS) or {}).get("status", {}).get("phase") != "Pending"


async def test_a_landed_write_whose_answer_is_cut_short_is_read_back_as_landed(
    api: storage.ClusterApi, box: Sandbox
) -> None:
    outcomes: list[str] = []
    api.on_write = lambda verb, resource, result: outcomes.append(result)
    fault = box.inject_fault("PATCH", STATUS, applied=True, cut=True)
    record = await write_status(api, box, "Pending")
    assert fault.fired == 1
    assert (box.get(names.PLURAL, "g", NS) or {})["status"]["phase"] == "Pending"  # it landed
    assert record.key == KEY and outcomes == ["uncertain_resolved"]  # and the read-back said so


async def test_a_404_for_a_type_not_served_is_no_answer_about_the_group(tmp_path: Path) -> None:
    """A restarted apiserver serves a CRD's type only once the CRD is established: until then a group's path is
    404 with no object named in it. That says nothing of the group, so it is no ``Gone`` (which would release an
    unsettled claim): it is retried."""
    empty = tmp_path / "no-crds"
    empty.mkdir()
    async with Sandbox(nodes=0, kubelet_delay=None, crds=empty, kubeconfig_path=tmp_path / "kubeconfig") as bare:
        cluster_api = storage.ClusterApi(await connecting.api_client(str(bare.kubeconfig)))
        try:
            with pytest.raises(storage.RetryLater) as raised:
                await cluster_api.read_group(KEY)
            assert not isinstance(raised.value, storage.Gone) and "not served" in str(raised.value)
        finally:
            await cluster_api.close()
