"""Mutating webhooks on pod CREATE: a real HTTPS AdmissionReview round trip, and what decides it."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox import tls
from tests.sandbox.helpers import PODS, Http, pod

GROUP_ANNOTATION = "deviceshare.io/device-group"


class FakeWebhook:
    """An HTTPS admission webhook that records reviews and answers as told."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.deny: str | None = None
        self.answering = asyncio.Event()  # cleared: reviews are taken and never answered (a hung webhook)
        self.answering.set()
        self.url = ""
        self.ca = b""

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        review = await request.json()
        self.reviews.append(review)
        await self.answering.wait()
        uid = review["request"]["uid"]
        if self.deny:
            return aiohttp.web.json_response(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": uid, "allowed": False, "status": {"code": 403, "message": self.deny}},
                }
            )
        ops = [
            {"op": "add", "path": "/spec/schedulerName", "value": "deviceshare-scheduler"},
            {"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}},
        ]
        return aiohttp.web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": uid,
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(ops).encode()).decode(),
                },
            }
        )


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[FakeWebhook]:
    hook = FakeWebhook()
    hook.ca, context = tls.make_ca_and_server(tmp_path, ["hook.system.svc"])
    app = aiohttp.web.Application()
    app.router.add_post("/mutate", hook.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    hook.url = f"https://127.0.0.1:{port}"
    yield hook
    hook.answering.set()
    await runner.cleanup()


def configuration(hook: FakeWebhook, **overrides: Any) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": "pods.deviceshare.io",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {"url": f"{hook.url}/mutate", "caBundle": base64.b64encode(hook.ca).decode()},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "failurePolicy": "Fail",
        "timeoutSeconds": 2,
        "matchConditions": [
            {
                "name": "has-group",
                "expression": f"has(object.metadata.annotations) && '{GROUP_ANNOTATION}' in "
                "object.metadata.annotations",
            }
        ],
    }
    webhook.update(overrides)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "deviceshare"},
        "webhooks": [webhook],
    }


def member(name: str, **labels: str) -> dict[str, Any]:
    return pod(name, metadata={"annotations": {GROUP_ANNOTATION: "g"}, "labels": labels})


async def test_webhook_mutates_pods_through_a_real_admission_review(
    sandbox: Sandbox, http: Http, webhook: FakeWebhook
) -> None:
    sandbox.create(configuration(webhook))
    status, created = await http.call("POST", PODS, member("p"))
    assert status == 201, created
    assert created["spec"]["schedulerName"] == "deviceshare-scheduler"
    assert created["metadata"]["labels"] == {"mutated": "yes"}
    review = webhook.reviews[0]
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    request = review["request"]
    assert request["operation"] == "CREATE" and request["namespace"] == "default"
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["object"]["metadata"]["name"] == "p"


async def test_match_condition_skips_pods_without_the_annotation(
    sandbox: Sandbox, http: Http, webhook: FakeWebhook
) -> None:
    sandbox.create(configuration(webhook))
    status, created = await http.call("POST", PODS, pod("plain"))
    assert status == 201 and webhook.reviews == []
    assert created["spec"]["schedulerName"] == "default-scheduler"


async def test_denial_reaches_the_client_with_the_webhook_message(
    sandbox: Sandbox, http: Http, webhook: FakeWebhook
) -> None:
    sandbox.create(configuration(webhook))
    webhook.deny = 'SharedDeviceGroup "g" does not exist in namespace "default"'
    status, error = await http.call("POST", PODS, member("p"))
    assert status == 403
    assert error["message"] == (
        'admission webhook "pods.deviceshare.io" denied the request: '
        'SharedDeviceGroup "g" does not exist in namespace "default"'
    )
    assert sandbox.get("pods", "p", "default") is None


@pytest.mark.parametrize(("policy", "created"), [("Fail", False), ("Ignore", True)])
@pytest.mark.parametrize("breakage", ["unreachable", "wrong-ca", "timeout"])
async def test_failure_policy_decides_when_the_webhook_cannot_answer(
    sandbox: Sandbox,
    http: Http,
    webhook: FakeWebhook,
    tmp_path: Path,
    policy: str,
    created: bool,
    breakage: str,
) -> None:
    config = configuration(webhook, failurePolicy=policy, timeoutSeconds=1)
    client = config["webhooks"][0]["clientConfig"]
    if breakage == "unreachable":
        client["url"] = "https://127.0.0.1:1/mutate"
    elif breakage == "wrong-ca":
        other_ca, _ = tls.make_ca_and_server(tmp_path, [])
        client["caBundle"] = base64.b64encode(other_ca).decode()
    else:
        webhook.answering.clear()  # the review arrives and is never answered: the 1 s timeout must end it
    sandbox.create(config)
    status, body = await http.call("POST", PODS, member("p"))
    assert len(webhook.reviews) == (1 if breakage == "timeout" else 0)  # each breaks where it says
    if created:
        assert status == 201 and body["spec"]["schedulerName"] == "default-scheduler"
    else:
        assert status == 500 and 'failed calling webhook "pods.deviceshare.io"' in body["message"]


@pytest.mark.parametrize(
    ("selector_field", "selector", "labels", "called"),
    [
        ("objectSelector", {"matchLabels": {"join": "yes"}}, {"join": "yes"}, True),
        ("objectSelector", {"matchLabels": {"join": "yes"}}, {}, False),
        ("namespaceSelector", {"matchLabels": {"kubernetes.io/metadata.name": "default"}}, {}, True),
        (
            "namespaceSelector",
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["default"]}
                ]
            },
            {},
            False,
        ),
    ],
)
async def test_selectors_decide_which_pods_are_sent(
    sandbox: Sandbox,
    http: Http,
    webhook: FakeWebhook,
    selector_field: str,
    selector: dict[str, Any],
    labels: dict[str, str],
    called: bool,
) -> None:
    sandbox.create(configuration(webhook, **{selector_field: selector}))
    status, _ = await http.call("POST", PODS, member("p", **labels))
    assert status == 201
    assert bool(webhook.reviews) is called


async def test_service_reference_is_verified_against_the_service_dns_name(
    tmp_path: Path, webhook: FakeWebhook
) -> None:
    endpoints = {("system", "hook"): webhook.url}
    async with Sandbox(nodes=1, kubelet_delay=None, service_endpoints=endpoints) as sandbox:
        config = configuration(webhook)
        config["webhooks"][0]["clientConfig"] = {
            "service": {"namespace": "system", "name": "hook", "path": "/mutate", "port": 443},
            "caBundle": base64.b64encode(webhook.ca).decode(),
        }
        sandbox.create(config)
        async with aiohttp.ClientSession() as session:
            status, created = await Http(session, sandbox.url).call("POST", PODS, member("p"))
    assert status == 201 and created["metadata"]["labels"] == {"mutated": "yes"}


async def test_webhook_is_told_whether_the_request_is_a_dry_run(
    sandbox: Sandbox, http: Http, webhook: FakeWebhook
) -> None:
    # kube-apiserver sets request.dryRun; a webhook with side effects must skip them on a dry run.
    sandbox.create(configuration(webhook))
    status, created = await http.call("POST", PODS, member("tried"), params={"dryRun": "All"})
    assert status == 201, created
    assert created["metadata"]["labels"] == {"mutated": "yes"}  # admitted (and mutated) as usual
    assert sandbox.get("pods", "tried", "default") is None  # ... but not stored
    status, created = await http.call("POST", PODS, member("kept"))
    assert status == 201, created
    assert [(r["request"]["object"]["metadata"]["name"], r["request"]["dryRun"]) for r in webhook.reviews] == [
        ("tried", True), ("kept", False)
    ]
