"""The whole path: a real AdmissionReview over real HTTPS to the server, groups from a fake API."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from deviceshare.api import envnames, names
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import admission, certs, misses, server
from tests import waiting
from tests.webhooks import fakeapi
from tests.webhooks.fakeapi import GROUPS, PODS
from tests.webhooks.test_admission import make_review, pod


def trusting(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


@pytest.fixture
async def webhook(
    fake_api: fakeapi.FakeApi, api_client: client.ApiClient, tls_files: tuple[Path, Path, Path]
) -> AsyncIterator[server.RunningWebhook]:
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer", {"nvidia.com/gpu": 2}, maxMembers=2))
    _, cert, key = tls_files
    running = await server.start_webhook(
        tls_cert=cert, tls_key=key, api_client=api_client, host="127.0.0.1", warmup_timeout_s=0.2
    )
    yield running
    await running.stop()


@pytest.fixture
async def http(bundle: certs.CertBundle) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(bundle.ca_pem))) as session:
        yield session


async def post(http: aiohttp.ClientSession, running: server.RunningWebhook, body: Any) -> tuple[int, Any]:
    async with http.post(
        running.mutate_url, data=json.dumps(body), headers={"Content-Type": "application/json"}
    ) as r:
        return r.status, await r.json()


async def test_admission_over_https(webhook: server.RunningWebhook, http: aiohttp.ClientSession) -> None:
    await webhook.webhook.lookup.wait_synced(waiting.HANG_GUARD)
    status, answer = await post(http, webhook, make_review(pod("trainer"), uid="e2e-1"))
    assert status == 200
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "e2e-1"
    assert answer["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": names.DEFAULT_SCHEDULER_NAME} in patch
    assert patch[-1]["value"] == [admission.env_entry("NVIDIA_VISIBLE_DEVICES")]


async def test_denials_and_member_limit_over_https(
    webhook: server.RunningWebhook, http: aiohttp.ClientSession, fake_api: fakeapi.FakeApi
) -> None:
    await webhook.webhook.lookup.wait_synced(waiting.HANG_GUARD)
    _, answer = await post(http, webhook, make_review(pod("missing")))
    assert answer["response"]["allowed"] is False
    assert "'missing' does not exist" in answer["response"]["status"]["message"]

    fake_api.put(PODS, fakeapi.member("ml", "m0", "trainer", "Running"))
    fake_api.put(PODS, fakeapi.member("ml", "m1", "trainer", "Running"))
    for _ in range(200):  # the member watch delivers asynchronously
        _, answer = await post(http, webhook, make_review(pod("trainer")))
        if not answer["response"]["allowed"]:
            break
    assert "already has 2 of its maxMembers=2 members" in answer["response"]["status"]["message"]


async def test_not_ready_and_retry_denial_while_the_api_is_slow(
    fake_api: fakeapi.FakeApi,
    api_client: client.ApiClient,
    tls_files: tuple[Path, Path, Path],
    http: aiohttp.ClientSession,
) -> None:
    fake_api.lists_flowing.clear()  # the API answers no list until the test lets it
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer"))
    _, cert, key = tls_files
    running = await server.start_webhook(
        tls_cert=cert, tls_key=key, api_client=api_client, warmup_timeout_s=0.05
    )
    try:
        async with http.get(running.url + "/readyz") as r:
            assert r.status == 503
        async with http.get(running.url + "/healthz") as r:
            assert r.status == 200
        # Pods that don't opt in never wait.
        _, answer = await post(http, running, make_review(pod(None)))
        assert answer["response"]["allowed"] is True
        _, answer = await post(http, running, make_review(pod("trainer")))
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"]["message"] == admission.RETRY_MESSAGE
        # Once synced (within the bounded wait) the same pod is admitted.
        fake_api.lists_flowing.set()
        running.webhook.settings.warmup_timeout_s = waiting.HANG_GUARD
        _, answer = await post(http, running, make_review(pod("trainer")))
        assert answer["response"]["allowed"] is True
        async with http.get(running.url + "/readyz") as r:
            assert r.status == 200
    finally:
        await running.stop()


async def test_malformed_body_is_a_400(webhook: server.RunningWebhook, http: aiohttp.ClientSession) -> None:
    async with http.post(webhook.mutate_url, data=b"{not json") as r:
        assert r.status == 400
    status, _ = await post(http, webhook, {"kind": "AdmissionReview"})
    assert status == 400


async def test_metrics_count_outcomes(webhook: server.RunningWebhook, http: aiohttp.ClientSession) -> None:
    await webhook.webhook.lookup.wait_synced(waiting.HANG_GUARD)
    await post(http, webhook, make_review(pod("trainer")))
    await post(http, webhook, make_review(pod("missing")))
    await post(http, webhook, make_review(pod(None)))
    async with http.get(webhook.url + "/metrics") as r:
        text = await r.text()
        assert r.headers["Content-Type"].startswith("text/plain")
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"
    }
    prefix = "deviceshare_webhook_admission_requests_total"
    assert samples[f'{prefix}{{path="/mutate-pods",result="patched"}}'] == 1
    assert samples[f'{prefix}{{path="/mutate-pods",result="denied"}}'] == 1
    assert samples[f'{prefix}{{path="/mutate-pods",result="skipped"}}'] == 1
    assert samples['deviceshare_webhook_admission_duration_seconds_count{path="/mutate-pods"}'] == 3
    assert samples["deviceshare_webhook_cache_synced"] == 1


async def test_env_config_and_scheduler_name_are_used(
    fake_api: fakeapi.FakeApi,
    api_client: client.ApiClient,
    tls_files: tuple[Path, Path, Path],
    http: aiohttp.ClientSession,
) -> None:
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer"))
    _, cert, key = tls_files
    running = await server.start_webhook(
        tls_cert=cert,
        tls_key=key,
        api_client=api_client,
        env_names=envnames.EnvNames({"nvidia.com/gpu": ["CUDA_VISIBLE_DEVICES"]}),
        scheduler_name="my-scheduler",
    )
    try:
        await running.webhook.lookup.wait_synced(waiting.HANG_GUARD)
        _, answer = await post(http, running, make_review(pod("trainer")))
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert patch[0]["value"] == "my-scheduler"
        assert patch[-1]["value"] == [admission.env_entry("CUDA_VISIBLE_DEVICES")]
    finally:
        await running.stop()


async def test_an_internal_error_is_a_plain_denial_with_the_details_only_in_the_log(
    webhook: server.RunningWebhook, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await webhook.webhook.lookup.wait_synced(waiting.HANG_GUARD)

    def broken(namespace: str, name: str) -> None:
        raise KeyError("secret-internal-detail")

    monkeypatch.setattr(webhook.webhook.lookup, "group", broken)
    status, answer = await post(http, webhook, make_review(pod("trainer"), uid="odd"))
    assert status == 200
    assert answer["response"]["uid"] == "odd"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    message = answer["response"]["status"]["message"]
    assert "internal error" in message
    assert "secret-internal-detail" not in json.dumps(answer) and "KeyError" not in json.dumps(answer)
    assert "secret-internal-detail" in caplog.text  # the details: in the log, with the review's uid
    assert "'odd'" in caplog.text


async def test_pods_naming_missing_groups_cost_the_api_one_lookup_per_name(
    webhook: server.RunningWebhook, http: aiohttp.ClientSession, fake_api: fakeapi.FakeApi
) -> None:
    assert webhook.index is not None and await webhook.index.wait_synced(waiting.HANG_GUARD)
    webhook.index.misses = misses.MissLimiter(clock=lambda: 0.0)  # time stands still: one interval
    for _ in range(25):
        _, answer = await post(http, webhook, make_review(pod("ghost")))
        assert "'ghost' does not exist" in answer["response"]["status"]["message"]
    assert fake_api.group_gets() == 1
    for name in ("Ghost_1", "a" * 64, "x/../y"):  # cannot be a group's name: denied without asking
        _, answer = await post(http, webhook, make_review(pod(name)))
        assert "is not a valid group name" in answer["response"]["status"]["message"]
    assert fake_api.group_gets() == 1


async def test_a_group_created_just_before_its_pod_is_found_even_if_the_watch_lags(tmp_path: Any) -> None:
    """One `kubectl apply -f` with a group and its pods: the watch may not have delivered the group yet."""
    async with Sandbox(nodes=1, kubelet_delay=0, kubeconfig_path=tmp_path / "kc") as sandbox:
        bundle = certs.generate(["127.0.0.1"])
        _, cert, key = bundle.write(tmp_path)
        hook = await server.start_webhook(tls_cert=str(cert), tls_key=str(key), kubeconfig=str(sandbox.kubeconfig),
                                          warmup_timeout_s=waiting.HANG_GUARD)  # bounds the lookup too
        try:
            assert await hook.index.wait_synced(waiting.HANG_GUARD)
            # The group watch is open (else it would start after the create and deliver the group from its
            # backlog); stalled, nothing new reaches the cache from here on.
            await waiting.until(lambda: sandbox.open_watches("shareddevicegroups"), "the group watch open")
            sandbox.stall_watches()
            sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
            sandbox.create({
                "apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
                "metadata": {"name": "fresh", "namespace": "ml"}, "spec": {"resources": {"nvidia.com/gpu": 1}},
            })
            review = make_review(pod(group="fresh"))  # namespace "ml", as the group
            ctx = ssl.create_default_context(cadata=bundle.ca_pem.decode())
            async with aiohttp.ClientSession() as http, http.post(hook.mutate_url, json=review, ssl=ctx) as resp:
                answer = await resp.json()
            assert answer["response"]["allowed"] is True, answer["response"].get("status")
            assert answer["response"]["patchType"] == "JSONPatch"
            # Found by looking it up, not by the (stalled) watch.
            assert [r for r in sandbox.api if str(r.method.value) == "GET"
                    and r.url.path.endswith("/namespaces/ml/shareddevicegroups/fresh")]
        finally:
            sandbox.resume_watches()
            await hook.stop()
