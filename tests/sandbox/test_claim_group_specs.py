"""A DRA group's spec (CONTRACT §13) at the API server: the CRD takes a good claim group, refuses each bad one
with the message that names the problem, freezes the claim once Bound, and `kubectl get sdg` shows the claim."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import SDG, Http, sdg
from tests.sandbox.test_clients import KUBECTL, kubectl

MERGE = "application/merge-patch+json"
CLAIM = {"deviceClassName": "gpu.nvidia.com", "count": 2}
H100 = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"
MEMORY_SHARE = {"gpu.nvidia.com": {"capacity": {"memory": "24Gi"}}}


def claim_group(name: str, **spec: Any) -> dict[str, Any]:
    body = sdg(name)
    body["spec"] = spec
    return body


@pytest.mark.parametrize(
    "spec",
    [
        {"claim": CLAIM},
        {"claim": {**CLAIM, "selectors": [H100]}, "minMembers": 2},
        {"claim": CLAIM, "share": MEMORY_SHARE},
    ],
)
async def test_a_good_claim_group_is_created_with_its_defaults(http: Http, spec: dict[str, Any]) -> None:
    status, created = await http.call("POST", SDG, claim_group("g", **spec))
    assert status == 201, created
    assert created["spec"]["claim"]["deviceClassName"] == "gpu.nvidia.com"
    assert "resources" not in created["spec"]  # no default fills it in: a claim group has none
    assert created["spec"]["schedulingStrategy"] == "binpack"


async def test_count_defaults_to_one_as_in_a_resource_claim(http: Http) -> None:
    status, created = await http.call("POST", SDG, claim_group("g", claim={"deviceClassName": "gpu.nvidia.com"}))
    assert status == 201 and created["spec"]["claim"] == {"deviceClassName": "gpu.nvidia.com", "count": 1}


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"resources": {"nvidia.com/gpu": 1}, "claim": CLAIM}, "spec",
         "exactly one of spec.claim and spec.resources must be set"),
        ({"claim": {"count": 1}}, "spec.claim.deviceClassName", "Required value"),
        ({"claim": {**CLAIM, "count": 33}}, "spec.claim.count", "less than or equal to 32"),
        ({"claim": {**CLAIM, "count": 0}}, "spec.claim.count", "greater than or equal to 1"),
        ({"claim": {**CLAIM, "deviceClassName": "NVIDIA_GPU"}}, "spec.claim.deviceClassName", "should match"),
        ({"claim": {**CLAIM, "selectors": [H100] * 33}}, "spec.claim.selectors", "must have at most 32 items"),
        ({"claim": {**CLAIM, "selectors": [""]}}, "spec.claim.selectors[0]", "at least 1 chars long"),
        ({"claim": CLAIM, "share": {"amd.com": {"capacity": {"memory": "24Gi"}}}}, "spec",
         "a claim group's share key is spec.claim.deviceClassName"),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"memory": "24Gi"}}}, "spec",
         "a claim group's share takes capacity requests alone"),
        ({"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"capacity": {"memory": "1Gi"}}}},
         "spec", "share capacity is for a claim group (spec.claim)"),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "1Gi"}, "tiles": 1}}},
         "spec.share.gpu.nvidia.com", "capacity stands alone in a share entry"),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "24GB"}}}},
         "spec.share.gpu.nvidia.com.capacity.memory", "should match"),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"1memory": "1Gi"}}}},
         "spec.share.gpu.nvidia.com.capacity", "capacity names are qualified names"),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {}}}},
         "spec.share.gpu.nvidia.com.capacity", "should have at least 1 properties"),
    ],
)
async def test_a_bad_claim_group_is_refused_naming_the_problem(
    http: Http, spec: dict[str, Any], field: str, words: str
) -> None:
    status, error = await http.call("POST", SDG, claim_group("bad", **spec))
    assert (status, error["reason"]) == (422, "Invalid"), error
    causes = {c["field"]: c["message"] for c in error["details"]["causes"]}
    assert field in causes and words in causes[field], causes


async def _bound(http: Http, **spec: Any) -> None:
    status, created = await http.call("POST", SDG, claim_group("g", **spec))
    assert status == 201, created
    status, _ = await http.call("PATCH", f"{SDG}/g/status", {"status": {"phase": "Bound"}}, content_type=MERGE)
    assert status == 200


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"claim": {"count": 3}}}, "spec.claim is immutable once the group is Bound"),
        ({"spec": {"claim": {"selectors": [H100]}}}, "spec.claim is immutable once the group is Bound"),
        ({"spec": {"claim": None, "share": None, "resources": {"nvidia.com/gpu": 2}}}, "spec.resources is immutable"),
        ({"spec": {"share": {"gpu.nvidia.com": {"capacity": {"memory": "30Gi"}}}}}, "spec.share is immutable"),
    ],
)
async def test_a_bound_claim_group_keeps_its_claim(http: Http, patch: dict[str, Any], message: str) -> None:
    await _bound(http, claim=CLAIM, share=MEMORY_SHARE)
    status, error = await http.call("PATCH", f"{SDG}/g", patch, content_type=MERGE)
    assert status == 422 and message in error["message"], error


async def test_a_pending_claim_group_may_change_and_a_bound_one_its_other_fields(http: Http) -> None:
    await http.call("POST", SDG, claim_group("g", claim=CLAIM))
    status, _ = await http.call("PATCH", f"{SDG}/g", {"spec": {"claim": {"count": 3}}}, content_type=MERGE)
    assert status == 200
    await http.call("PATCH", f"{SDG}/g/status", {"status": {"phase": "Bound"}}, content_type=MERGE)
    status, changed = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 4}}, content_type=MERGE)
    assert status == 200 and changed["spec"]["claim"]["count"] == 3  # the rules do not trip on a claim group


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")
async def test_kubectl_shows_the_claim_and_the_refusal(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, gpus=2, dra=True, kubeconfig_path=tmp_path / "kc") as sandbox:
        good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
        good.write_text(json.dumps(claim_group("trainer", claim=CLAIM)))
        bad.write_text(json.dumps(claim_group("both", claim=CLAIM, resources={"nvidia.com/gpu": 1})))
        applied = await asyncio.to_thread(kubectl, sandbox.kubeconfig, "apply", "-f", str(good))
        assert applied.returncode == 0, applied.stderr
        refused = await asyncio.to_thread(kubectl, sandbox.kubeconfig, "apply", "-f", str(bad))
        assert refused.returncode != 0
        assert "exactly one of spec.claim and spec.resources must be set" in refused.stderr
        listed = await asyncio.to_thread(kubectl, sandbox.kubeconfig, "get", "sdg")
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()[:2]
        assert header.split()[:6] == ["NAME", "PHASE", "NODE", "DEVICES", "SHARE", "CLAIM"]
        assert row.split()[0] == "trainer" and "gpu.nvidia.com" in row.split()
