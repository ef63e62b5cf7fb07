"""Fixtures for the tenant-attack suite: a sandbox with tainted shared nodes, the admission policy of
manifests/base, the real webhook over TLS, the real operator under its service account, and API
clients acting as the admin, the operator and a tenant.

Attacks go through the API only, as a tenant with kubectl would. ``policy_installed`` (default
True) can be overridden to run the same attacks against the operator alone:

    @pytest.fixture
    def policy_installed() -> bool:
        return False
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox, identity
from deviceshare.sandbox import cluster as sandbox_cluster
from deviceshare.webhooks import certs, configuration, limits, server
from tests.operator.conftest import RunningOperator, cluster, kube, operator_config, start_operator
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.operator_attacks import sandbox_options, system

# The operator-alone suites (test_operator_*.py) run on tests/operator's cluster with these two.
__all__ = ["cluster", "kube", "sandbox_options", "system"]

POLICY = Path(__file__).resolve().parents[2] / "manifests" / "base" / "admission-policy.yaml"


@pytest.fixture
def policy_installed() -> bool:
    return True


@pytest.fixture
def webhook_limits() -> limits.Limits:
    """Override for tests of the webhook's own limits (short deadlines, a small cap)."""
    return limits.Limits()


@pytest.fixture
def sandbox_overrides() -> dict[str, object]:
    """Override in a test module for another cluster (``Sandbox`` options: DRA, more users...)."""
    return {}


@pytest.fixture
async def sandbox(
    tmp_path: Path, policy_installed: bool, sandbox_overrides: dict[str, object]
) -> AsyncIterator[Sandbox]:
    options = {"nodes": 2, "gpus": 4, "shared_taint": True, "kubelet_delay": 0.01,
               "kubeconfig_path": tmp_path / "kubeconfig", "bookmark_interval": 0.1, **sandbox_overrides}
    async with Sandbox(**options) as box:  # type: ignore[arg-type]
        if policy_installed:
            for doc in sandbox_cluster.load_manifests(POLICY):
                box.create(doc)
        for ns in attacks.TENANT_NAMESPACES:
            box.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        box.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": attacks.EXEMPT_NAMESPACE, "labels": {names.NAMESPACE_EXEMPT_LABEL: "true"}}})
        yield box


@pytest.fixture
async def webhook(
    sandbox: Sandbox, tmp_path: Path, webhook_limits: limits.Limits
) -> AsyncIterator[server.RunningWebhook]:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(sandbox.kubeconfig),
                                      bounds=webhook_limits)
    try:
        sandbox.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        sandbox.create(configuration.build_group_validation(ca_bundle=bundle.ca_pem, url=hook.url))
        assert hook.index is not None
        await attacks.until(lambda: hook.index is not None and hook.index.budget_synced, "the webhook's caches")
        yield hook
    finally:
        await hook.stop()


@pytest.fixture
async def operator(sandbox: Sandbox) -> AsyncIterator[RunningOperator]:
    """The real operator, writing as its service account (what the policy allows device annotations to)."""
    kubeconfig = sandbox.kubeconfig_as(identity.OPERATOR_TOKEN)
    running = await start_operator(operator_config(sandbox, kubeconfig=str(kubeconfig)))
    yield running
    await running.stop()


@pytest.fixture
async def admin(sandbox: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(sandbox.kubeconfig)) as kube:
        yield kube


@pytest.fixture
async def tenant(sandbox: Sandbox) -> AsyncIterator[Kube]:
    """A tenant with the usual namespace rights: create/patch/delete pods, create groups."""
    async with Kube.connect(str(sandbox.kubeconfig_as(identity.TENANT_TOKEN))) as kube:
        yield kube


@pytest.fixture
async def as_operator(sandbox: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(sandbox.kubeconfig_as(identity.OPERATOR_TOKEN))) as kube:
        yield kube
