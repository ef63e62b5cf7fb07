"""``Sandbox``: a local Kubernetes API with simulated GPU nodes, in the caller's event loop.

It bundles the store, the HTTP server, the CRDs from ``crds/``, the nodes and the kubelet, and
writes a kubeconfig so kubectl, kubernetes_asyncio and Kopf can talk to it. The conveniences
(``add_node``, ``get``, ``create``, ``patch``...: ``conveniences.py``) write through the same store as the
HTTP API, so watchers see them; the fault hooks (``inject_fault``...) are in ``hooks.py``.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

import kmock
import yaml

from deviceshare.sandbox import (
    admission,
    apiserver,
    catalog,
    claimquotas,
    conveniences,
    dradriver,
    hooks,
    identity,
    kubelet,
    store,
)
from deviceshare.sandbox import deployments as deployments_
from deviceshare.sandbox import disruption as disruption_
from deviceshare.sandbox import front as front_
from deviceshare.sandbox import priority as priority_classes

CONTEXT = "deviceshare-sandbox"
DEFAULT_GPU_MEMORY_MIB = 81920  # an 80 GB A100/H100, as GPU feature discovery reports it
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# Re-exported: where the demo and the tests have always found them.
INTEL_RESOURCE = conveniences.INTEL_RESOURCE
SHARED_NODE_TAINT = conveniences.SHARED_NODE_TAINT
load_manifests = conveniences.load_manifests


def default_crds() -> Path | None:
    """The repository's ``crds/`` folder, or the copy packaged under ``deviceshare/data``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent.parent / "crds", package / "data"):
        if candidate.is_dir() and any(candidate.glob("*.yaml")):
            return candidate
    return None


class Sandbox(hooks.FaultHooks, conveniences.Conveniences):
    def __init__(
        self,
        *,
        nodes: int = 4,
        gpus: int = 8,
        resource: str = "nvidia.com/gpu",
        crds: Path | None = None,
        kubelet_delay: float | None = 0.05,
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig_path: Path | None = None,
        node_cpu: str = "64",
        node_memory: str = "512Gi",
        labels: Mapping[str, str] | None = None,
        service_endpoints: admission.Endpoints | None = None,
        watch_history: int = 10_000,
        bookmark_interval: float = 5.0,
        users: Mapping[str, identity.User] | None = None,
        shared_taint: bool = False,
        gpu_memory_mib: int | None = DEFAULT_GPU_MEMORY_MIB,
        intel_nodes: int = 0,
        deployments: bool = False,
        disruption: bool = True,
        dra: bool = False,
        dra_shared: bool = False,
        dra_nodes: Mapping[str, str] | None = None,
        front: bool = False,
        tls: tuple[bytes, ssl.SSLContext] | None = None,
        whole_lists: bool = False,
    ) -> None:
        self.resource = resource
        self.gpus = gpus
        # What NVIDIA's GPU feature discovery labels a node with (MiB per GPU): sharing groups that ask
        # for memory need it (CONTRACT §7). None: the nodes declare no device memory.
        self.gpu_memory_mib = gpu_memory_mib
        self.node_cpu, self.node_memory = node_cpu, node_memory
        self.node_labels = dict(labels or {})
        # Off by default: tests that create member pods without the webhook carry no toleration.
        self.shared_taint = shared_taint
        self.store = store.ObjectStore(catalog.Catalog(), history=watch_history)
        self.admission = admission.Admission(self.store, service_endpoints)
        self.api = apiserver.ApiServer(
            self.store,
            self.admission,
            bookmark_interval=bookmark_interval,
            users={**identity.DEFAULT_TOKENS, **(users or {})},
        )
        self.api.whole_lists = whole_lists  # every list answered in one body, ``limit`` ignored (apiserver.py)
        self.kubelet = kubelet.Kubelet(self.store, kubelet_delay) if kubelet_delay else None
        # Off by default: most tests create a Deployment's pods themselves (or none at all).
        self.deployments = deployments_.DeploymentController(self.store, self.admission) if deployments else None
        # PodDisruptionBudget status, which the Eviction API reads; it acts only where budgets exist.
        self.disruption = disruption_.DisruptionController(self.store) if disruption else None
        # Off by default: the NVIDIA DRA driver (DeviceClass gpu.nvidia.com, one ResourceSlice per GPU node);
        # dra_shared publishes its GPUs as devices that allow multiple allocations; dra_nodes (labels) runs its
        # kubelet plugin only on the nodes that carry them (None: every GPU node).
        self.dra_driver = (
            dradriver.GpuDriver(self.store, memory_mib=gpu_memory_mib or DEFAULT_GPU_MEMORY_MIB, shared=dra_shared,
                                node_selector=dra_nodes)
            if dra else None
        )
        if self.kubelet is not None:
            self.kubelet.gpu_driver = self.dra_driver
        self.claim_quotas = claimquotas.ClaimQuotaController(self.store)  # quota status for ResourceClaims
        self._host, self._port = host, port
        # Network faults (black holes, slow TLS handshakes: front.py) need clients to connect through a proxy;
        # ``tls`` (a CA certificate's PEM, and a server context with a certificate it signed): that proxy serves
        # HTTPS, and the kubeconfig trusts the CA.
        self._front_wanted, self._tls = front or tls is not None, tls
        self.front: front_.Front | None = None
        self._kubeconfig_path = kubeconfig_path
        self._server: kmock.Server | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self.url = ""
        self.kubeconfig = Path()
        for ns in SYSTEM_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for priority_class in priority_classes.system_classes():  # as the API server's bootstrap makes them
            self.create(priority_class)
        crd_dir = crds if crds is not None else default_crds()
        if crd_dir is not None:
            for doc in load_manifests(crd_dir):
                if doc.get("kind") != "Kustomization":  # crds/ is also a kustomize folder
                    self.create(doc)
        for index in range(nodes):
            self.add_node(f"gpu-node-{index}")
        for index in range(intel_nodes):
            self.add_intel_node(f"intel-node-{index}")

    # ---- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.api.__aenter__()
        self._server = kmock.Server(self.api, host=self._host, port=self._port or None)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")
        if self._front_wanted:
            await self._start_front()
        self.kubeconfig = self.write_kubeconfig(self._kubeconfig_path)
        if self.kubelet is not None:
            self.kubelet.start()
        if self.deployments is not None:
            self.deployments.start()
        if self.disruption is not None:
            self.disruption.start()
        if self.dra_driver is not None:
            self.dra_driver.start()
        self.claim_quotas.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.deployments is not None:
            self.deployments.stop()
        if self.disruption is not None:
            self.disruption.stop()
        if self.dra_driver is not None:
            self.dra_driver.stop()
        self.claim_quotas.stop()
        self.store.close_watches()
        self.api.faults.clear()  # no request stays held past the end
        if self.front is not None:
            await self.front.stop()
        if self._server is not None:
            await self._server.__aexit__(exc_type, exc, tb)
            self._server = None
        await self.api.__aexit__(exc_type, exc, tb)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    async def _start_front(self) -> None:
        self.front = front_.in_front_of(self.url, tls=self._tls[1] if self._tls else None)
        await self.front.start()
        self.url = self.front.url

    def _scratch_dir(self) -> str:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="deviceshare-sandbox-")
        return self._scratch.name

    def write_kubeconfig(self, path: Path | None = None, *, token: str = "deviceshare-sandbox") -> Path:
        """A kubeconfig for this sandbox; the default token is no registered user, i.e. the admin."""
        if path is None:  # a private folder, removed again when the sandbox stops
            path = Path(self._scratch_dir()) / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": CONTEXT,
            "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": self._cluster_entry()}],
            "users": [{"name": CONTEXT, "user": {"token": token}}],
            "contexts": [
                {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"}}
            ],
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _cluster_entry(self) -> dict[str, str]:
        entry = {"server": self.url}
        if self._tls is not None:
            entry["certificate-authority-data"] = base64.b64encode(self._tls[0]).decode()
        return entry

    def kubeconfig_as(self, token: str) -> Path:
        """A kubeconfig next to :attr:`kubeconfig` whose requests are made as the user of ``token``
        (``identity.OPERATOR_TOKEN``, ``identity.TENANT_TOKEN``, or one passed in ``users``)."""
        if token not in self.api.users:
            raise KeyError(f"no sandbox user has the token {token!r}")
        user = self.api.users[token].username.replace(":", "-")
        return self.write_kubeconfig(self.kubeconfig.with_name(f"{self.kubeconfig.name}.{user}"), token=token)
