"""ResourceQuota on ResourceClaims through the sandbox's HTTP API, as kube-apiserver's quota admission and the quota
controller keep it (pkg/quota/v1/evaluator/core/resource_claims.go; plugin/resourcequota/controller.go)."""

from __future__ import annotations

from typing import Any

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.dra_objects import CLAIMS, claim
from tests.sandbox.helpers import Http

QUOTAS = "/api/v1/namespaces/default/resourcequotas"
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
COUNT = "count/resourceclaims.resource.k8s.io"


async def _quota(http: Http, name: str, hard: dict[str, str], **spec: Any) -> None:
    status, made = await http.call("POST", QUOTAS, {"apiVersion": "v1", "kind": "ResourceQuota",
                                                    "metadata": {"name": name}, "spec": {"hard": hard, **spec}})
    assert status == 201, made


async def _used(http: Http, name: str) -> dict[str, str]:
    _, body = await http.call("GET", f"{QUOTAS}/{name}")
    return dict((body.get("status") or {}).get("used") or {})


async def test_a_claim_over_its_namespace_quota_is_refused_and_one_within_is_charged(
    sandbox: Sandbox, http: Http
) -> None:
    await _quota(http, "h100s", {DEVICES: "3", COUNT: "5", "pods": "10"})
    await _quota(http, "scoped", {DEVICES: "0"}, scopes=["BestEffort"])  # a scope never matches a claim
    await waiting.until(lambda: _used(http, "h100s"), "the quota controller's first count")
    assert await _used(http, "h100s") == {DEVICES: "0", COUNT: "0"}

    status, _ = await http.call("POST", CLAIMS, claim("a", count=2))
    assert status == 201
    assert await _used(http, "h100s") == {DEVICES: "2", COUNT: "1"}
    status, dry = await http.call("POST", CLAIMS, claim("dry", count=1), params={"dryRun": "All"})
    assert status == 201, dry
    assert await _used(http, "h100s") == {DEVICES: "2", COUNT: "1"}  # a dry run charges nothing

    status, refused = await http.call("POST", CLAIMS, claim("b", count=2))
    assert (status, refused["reason"]) == (403, "Forbidden")
    assert refused["message"] == (
        'resourceclaims.resource.k8s.io "b" is forbidden: exceeded quota: h100s, requested: '
        f"{DEVICES}=2, used: {DEVICES}=2, limited: {DEVICES}=3")
    all_mode = claim("all", count=None, allocationMode="All")  # counted as the 32 devices it may take
    status, refused = await http.call("POST", CLAIMS, all_mode)
    assert status == 403 and f"requested: {DEVICES}=32" in refused["message"]

    # Deleting a claim gives its devices back (the quota controller's replenishment): b now fits.
    status, _ = await http.call("DELETE", f"{CLAIMS}/a")
    assert status == 200

    async def freed() -> bool:
        return (await _used(http, "h100s")).get(DEVICES) == "0"

    await waiting.until(freed, "a's devices given back")
    status, _ = await http.call("POST", CLAIMS, claim("b", count=2))
    assert status == 201
    assert await _used(http, "h100s") == {DEVICES: "2", COUNT: "1"}
