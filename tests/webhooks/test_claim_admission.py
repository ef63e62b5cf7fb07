"""A member of a DRA group (CONTRACT §13) is wired to the group's ResourceClaim at CREATE, gets no env var, and may
not bring claims of its own: real AdmissionReviews, through the decision and over HTTPS to the real server."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from kubernetes_asyncio import client

from deviceshare.api import names
from deviceshare.webhooks import admission, certs, server
from tests import waiting
from tests.webhooks import fakeapi
from tests.webhooks.fakeapi import GROUPS
from tests.webhooks.test_admission import groups as view_of
from tests.webhooks.test_admission import make_review, patch_of, pod, run
from tests.webhooks.test_server import post, trusting

DRA = {"claim": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
OURS = {"name": "deviceshare", "resourceClaimName": "trainer-devices"}
NIC = {"name": "nic", "resourceClaimName": "my-nic"}


def wired(body: dict[str, Any]) -> dict[str, Any]:
    response = run(make_review(body), view_of(trainer=DRA))
    assert response["response"]["allowed"] is True, response
    patched: dict[str, Any] = jsonpatch.apply_patch(body, patch_of(response))
    return patched


def test_every_container_and_init_container_takes_the_groups_claim() -> None:
    body = pod(initContainers=[{"name": "setup", "image": "x"}],
               containers=[{"name": "main", "image": "x"},
                           {"name": "side", "image": "x", "resources": {"limits": {"cpu": "1"}}}])
    spec = wired(body)["spec"]
    assert spec["resourceClaims"] == [OURS]
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert container["resources"]["claims"] == [{"name": "deviceshare"}], container["name"]
        assert "env" not in container  # no visibility env var: the driver hands the devices over (CDI)
    assert spec["containers"][1]["resources"]["limits"] == {"cpu": "1"}  # the pod's own resources stay
    assert spec["schedulerName"] == names.DEFAULT_SCHEDULER_NAME


def test_a_reinvocation_adds_nothing_and_a_hand_wired_pod_is_kept() -> None:
    first = wired(pod())
    assert patch_of(run(make_review(first), view_of(trainer=DRA))) == []
    by_hand = pod(resourceClaims=[OURS],
                  containers=[{"name": "main", "image": "x", "resources": {"claims": [{"name": "deviceshare"}]}}])
    assert wired(by_hand)["spec"]["resourceClaims"] == [OURS]
    assert wired(by_hand)["spec"]["containers"][0]["resources"]["claims"] == [{"name": "deviceshare"}]


def test_a_share_group_gets_the_claim_and_no_mps_limits() -> None:
    share = {**DRA, "share": {"gpu.nvidia.com": {"capacity": {"memory": "24Gi"}}}}
    body = pod()
    response = run(make_review(body), view_of(trainer=share))
    spec = jsonpatch.apply_patch(body, patch_of(response))["spec"]
    assert spec["resourceClaims"] == [OURS] and "env" not in spec["containers"][0]


def test_a_group_of_extended_resources_gets_no_claim() -> None:
    body = pod()
    response = run(make_review(body), view_of(trainer={"resources": {"nvidia.com/gpu": 1}}))
    assert "resourceClaims" not in jsonpatch.apply_patch(body, patch_of(response))["spec"]


@pytest.mark.parametrize(
    ("group", "claims", "words"),
    [
        # Another group's claim in the same namespace under our name: its devices, not this group's.
        (DRA, [{"name": "deviceshare", "resourceClaimName": "other-devices"}],
         "spec.resourceClaims[0] ('deviceshare') points to the ResourceClaim 'other-devices'"),
        (DRA, [{"name": "deviceshare", "resourceClaimTemplateName": "gpus"}],
         "points to the ResourceClaimTemplate 'gpus'"),
        (DRA, [OURS, NIC], "spec.resourceClaims[1] ('nic'): a member of DRA group 'trainer' takes devices "
                           "through the group's claim 'trainer-devices' only"),
        (DRA, [{"name": "gpus", "resourceClaimName": "trainer-devices"}], "spec.resourceClaims[0] ('gpus')"),
        ({"resources": {"nvidia.com/gpu": 1}}, [NIC], "deviceshare allocates no ResourceClaim for it"),
    ],
)
def test_a_members_own_claims_are_refused_naming_them(
    group: dict[str, Any], claims: list[dict[str, Any]], words: str
) -> None:
    """Tenants are not trusted: a claim the pod brings is refused, never silently replaced or kept."""
    response = run(make_review(pod(resourceClaims=claims)), view_of(trainer=group))["response"]
    assert response["allowed"] is False
    assert words in response["status"]["message"], response["status"]["message"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"resourceClaims": {"name": "x"}}, "request.object.spec.resourceClaims is an object, not an array"),
        ({"resourceClaims": [{"name": 1}]}, "request.object.spec.resourceClaims[0].name is a number"),
        ({"containers": [{"name": "main", "resources": {"claims": "deviceshare"}}]},
         "request.object.spec.containers[0].resources.claims is a string, not an array"),
    ],
)
def test_malformed_claims_are_refused_naming_the_field(spec: dict[str, Any], path: str) -> None:
    """Checked before anything reads them; the server answers such a review with a 400 denial."""
    body = pod()
    body["spec"].update(spec)
    with pytest.raises(admission.MalformedReview) as raised:
        run(make_review(body), view_of(trainer=DRA))
    assert path in str(raised.value)


@pytest.fixture
async def http(bundle: certs.CertBundle) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(bundle.ca_pem))) as session:
        yield session


@pytest.fixture
async def dra_webhook(
    fake_api: fakeapi.FakeApi, api_client: client.ApiClient, tls_files: tuple[Path, Path, Path]
) -> AsyncIterator[server.RunningWebhook]:
    body = fakeapi.group("ml", "trainer")
    body["spec"] = DRA
    fake_api.put(GROUPS, body)
    _, cert, key = tls_files
    running = await server.start_webhook(
        tls_cert=cert, tls_key=key, api_client=api_client, host="127.0.0.1", warmup_timeout_s=0.2
    )
    yield running
    await running.stop()


async def test_the_server_wires_a_member_and_refuses_a_foreign_claim(
    dra_webhook: server.RunningWebhook, http: aiohttp.ClientSession
) -> None:
    await dra_webhook.webhook.lookup.wait_synced(waiting.HANG_GUARD)
    status, answer = await post(http, dra_webhook, make_review(pod("trainer"), uid="dra-1"))
    assert status == 200 and answer["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert {"op": "add", "path": "/spec/resourceClaims", "value": [OURS]} in patch
    container_claim = {"claims": [{"name": "deviceshare"}]}
    assert {"op": "add", "path": "/spec/containers/0/resources", "value": container_claim} in patch
    assert not [op for op in patch if op["path"].endswith("/env")]
    foreign = pod("trainer", resourceClaims=[{"name": "deviceshare", "resourceClaimName": "other-devices"}])
    _, answer = await post(http, dra_webhook, make_review(foreign, uid="dra-2"))
    assert answer["response"]["allowed"] is False
    assert "'other-devices'" in answer["response"]["status"]["message"]
