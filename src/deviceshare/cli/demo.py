"""``deviceshare demo``: the whole system in one process, on the embedded sandbox.

Starts the sandbox cluster (simulated GPU nodes), the admission webhook over real TLS (registered in
the sandbox as a MutatingWebhookConfiguration, so pod creations really go through it), and the
operator; applies ``examples/``; waits until every example pod is bound; then prints the groups, the
pods with the device IDs their containers will see, and the per-node device map.

A Deployment's pods are made by the sandbox's small Deployment controller (through the webhook, as a
ReplicaSet's are), named ``<deployment>-<n>``.

With ``--dra`` (the default when the examples have a ``dra`` folder, as the packaged ones do; ``--no-dra`` leaves
it out) the sandbox also runs its simulated NVIDIA DRA driver (ResourceSlices for the GPU nodes, the
DeviceClass ``gpu.nvidia.com``) and the demo applies ``examples/dra`` as well: a DRA group (CONTRACT §13) on the node
labelled ``deviceshare.io/pool=dra`` (the nodes dedicated to deviceshare's DRA groups). It then shows each DRA
group's ResourceClaim (state, node, devices, reserved for) and the CDI devices the kubelet got from the driver for
each member's containers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import logging
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from deviceshare import errors
from deviceshare.api import names
from deviceshare.cli import claimview, handoverview
from deviceshare.cli import inspect as inspect_cmd
from deviceshare.operator.config import OperatorConfig

if TYPE_CHECKING:
    from deviceshare.sandbox.cluster import Sandbox

# What the demo needs ships in the package (deviceshare/data links to examples/ and manifests/base in a
# checkout), so a pip-installed `deviceshare demo` runs the same from any folder.
PACKAGED = importlib.resources.files("deviceshare") / "data"
EXAMPLES = PACKAGED / "examples"
ADMISSION_POLICIES = PACKAGED / "policies" / "admission-policy.yaml"
DRA_POOL_LABEL = "deviceshare.io/pool"  # the examples' label for nodes dedicated to deviceshare's DRA groups


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument(
        "--examples", type=Path, default=EXAMPLES,
        help="folder of example manifests to apply (default: the examples packaged with deviceshare)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", type=Path, default=Path(".sandbox/demo-kubeconfig"),
        help="where to write the demo cluster's kubeconfig (for kubectl, with --keep-running)",
    )
    parser.add_argument(
        "--dra", action=argparse.BooleanOptionalAction, default=None,
        help="also run the simulated NVIDIA DRA driver and the DRA groups of <examples>/dra (CONTRACT §13); "
             "default: on when <examples>/dra exists (the packaged examples have it)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for every pod to be bound")
    parser.add_argument(
        "--keep-running", action="store_true",
        help="keep the cluster up after showing the result (point kubectl at the printed kubeconfig)",
    )


def run(args: argparse.Namespace) -> int:
    from deviceshare import sandbox

    sandbox.require()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.ERROR)  # e.g. "OS signals are ignored" in a thread
    try:
        return asyncio.run(demo(args))
    except KeyboardInterrupt:
        return 130


def _manifests(folder: Traversable) -> list[dict[str, Any]]:
    """The folder's objects but Nodes; refused up front when none of them makes a pod (nothing to show)."""
    if not folder.is_dir():
        raise errors.ConfigError(f"--examples {folder}: no such folder")
    docs: list[dict[str, Any]] = []
    for path in sorted((p for p in folder.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    if not any(d.get("kind") in ("Pod", "Deployment") for d in docs):
        raise errors.ConfigError(f"--examples {folder}: no Pod or Deployment in its *.yaml files, nothing to bind")
    return [d for d in docs if d.get("kind") != "Node"]  # the sandbox brings its own nodes


def _admission_policies() -> list[dict[str, Any]]:
    """manifests/base's ValidatingAdmissionPolicies and bindings, as packaged with deviceshare."""
    return [d for d in yaml.safe_load_all(ADMISSION_POLICIES.read_text()) if isinstance(d, dict)]


async def demo(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `deviceshare demo --help` need not load all of it.
    from deviceshare.kube import applying, connecting
    from deviceshare.operator.process import OperatorThread
    from deviceshare.sandbox import Sandbox, identity
    from deviceshare.sandbox.cluster import INTEL_RESOURCE as INTEL
    from deviceshare.webhooks import certs, configuration, server

    started = time.perf_counter()
    out = sys.stdout
    manifests = _manifests(args.examples)  # before starting anything: a folder with no pods is refused
    asked = getattr(args, "dra", False)
    dra = (args.examples / "dra").is_dir() if asked is None else bool(asked)
    if dra:
        manifests += _manifests(args.examples / "dra")
    async with contextlib.AsyncExitStack() as stack:
        sandbox = await stack.enter_async_context(
            Sandbox(nodes=args.nodes, gpus=args.gpus, kubeconfig_path=args.kubeconfig.resolve(),
                    kubelet_delay=0.2, shared_taint=True, deployments=True, intel_nodes=1, dra=dra,
                    dra_nodes={DRA_POOL_LABEL: "dra"})
        )
        policies = _admission_policies()  # as a cluster installed from manifests/base runs them
        for doc in policies:
            sandbox.create(doc)
        print(f"sandbox: {args.nodes} nodes x {args.gpus} nvidia.com/gpu ({sandbox.gpu_memory_mib} MiB each) and "
              f"1 node x 2 {INTEL} (2 tiles each) at {sandbox.url}", file=out)
        # One node takes its devices by CDI (CONTRACT §12), as a GPU Operator >= 25.10 node does; the others by env.
        # The first: binpack fills it first, so the demo shows pods handed their devices both ways.
        cdi_node = "gpu-node-0"
        sandbox.patch("nodes", cdi_node, {"metadata": {"labels": {names.NODE_HANDOVER_LABEL: "cdi"}}})
        print(f"{cdi_node}: {names.NODE_HANDOVER_LABEL}=cdi (devices by CDI annotation; the others by env var)",
              file=out)
        if dra:  # the last node: binpack fills the first ones with the other examples' groups
            dra_node = f"gpu-node-{args.nodes - 1}"
            sandbox.patch("nodes", dra_node, {"metadata": {"labels": {DRA_POOL_LABEL: "dra"}}})
            print(f"{dra_node}: {DRA_POOL_LABEL}=dra (its GPUs published by the simulated NVIDIA DRA driver, "
                  "DeviceClass gpu.nvidia.com)", file=out)
        api = await connecting.api_client(str(sandbox.kubeconfig))
        stack.push_async_callback(api.close)

        tls_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deviceshare-demo-")))
        bundle = certs.generate(["127.0.0.1", "localhost"])
        _, cert, key = bundle.write(tls_dir)
        webhook = await server.start_webhook(
            tls_cert=str(cert), tls_key=str(key), kubeconfig=str(sandbox.kubeconfig), host="127.0.0.1"
        )
        stack.push_async_callback(webhook.stop)
        await applying.apply(api, configuration.build(url=webhook.mutate_url, ca_bundle=bundle.ca_bundle))
        await applying.apply(api, configuration.build_group_validation(url=webhook.url, ca_bundle=bundle.ca_bundle))
        print(f"webhook: {webhook.mutate_url} (TLS, registered as a MutatingWebhookConfiguration)", file=out)
        if policies:
            shown = ", ".join(d["metadata"]["name"] for d in policies if d["kind"] == "ValidatingAdmissionPolicy")
            print(f"admission policies: {shown}; shared nodes tainted {names.SHARED_NODE_TAINT}=true:NoExecute",
                  file=out)

        # The operator writes as its service account, the only one the policies let write device annotations.
        operator_kubeconfig = sandbox.kubeconfig_as(identity.OPERATOR_TOKEN)
        config = OperatorConfig(kubeconfig=str(operator_kubeconfig), metrics_port=None)
        operator = await OperatorThread(config).start()
        stack.push_async_callback(operator.stop)
        print(f"operator: scheduling as {config.scheduler_name}", file=out)

        pods: list[tuple[str, str]] = []
        for obj in manifests:
            if obj.get("kind") == "Deployment":
                await applying.apply(api, obj)
                replicas = int((obj.get("spec") or {}).get("replicas", 1))
                ns = obj["metadata"].get("namespace", "default")
                pods += [(ns, f"{obj['metadata']['name']}-{i}") for i in range(replicas)]
                continue
            created = await applying.apply(api, obj)
            if obj.get("kind") == "Pod":
                pods.append((created["metadata"]["namespace"], created["metadata"]["name"]))
        print(f"applied {args.examples}: {len(pods)} pods", file=out)

        bound = await _wait_bound(sandbox, pods, args.timeout)
        print(file=out)
        _print_groups(sandbox, out)
        print(file=out)
        _print_pods(sandbox, pods, out)
        print(file=out)
        if dra:
            _print_claims(sandbox, out)
            print(file=out)
        snapshot = await inspect_cmd.read_snapshot(api, pods=False)
        inspect_cmd.render_table(snapshot.device_map(), out)
        print(f"\n{len(bound)}/{len(pods)} pods bound in {time.perf_counter() - started:.1f}s", file=out)
        if args.keep_running:
            print(f"\ncluster kept running: export KUBECONFIG={sandbox.kubeconfig}; Ctrl-C to stop", file=out)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        if len(bound) < len(pods):
            waiting = ", ".join(f"{ns}/{n}" for ns, n in pods if (ns, n) not in bound)
            print(f"deviceshare demo: not bound within --timeout {args.timeout:g}s: {waiting}", file=sys.stderr)
            return 1
        return 0


async def _wait_bound(
    sandbox: Sandbox, pods: Sequence[tuple[str, str]], seconds: float
) -> list[tuple[str, str]]:
    deadline = time.monotonic() + seconds
    while True:
        bound = [(ns, n) for ns, n in pods if _running(sandbox.get("pods", n, ns))]
        if len(bound) == len(pods) or time.monotonic() > deadline:
            return bound
        await asyncio.sleep(0.05)


def _running(pod: dict[str, Any] | None) -> bool:
    """Bound, and started by the (simulated) kubelet, so the env values are what containers see."""
    pod = pod or {}
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") == "Running"


def _print_groups(sandbox: Sandbox, out: Any) -> None:
    rows = [("NAMESPACE", "GROUP", "PHASE", "NODE", "DEVICES", "SHARE", "MEMBERS")]
    for g in sorted(sandbox.list(names.PLURAL), key=lambda g: (g["metadata"]["namespace"], g["metadata"]["name"])):
        st = g.get("status") or {}
        devices = "; ".join(f"{r}={','.join(ids)}" for r, ids in sorted((st.get("allocatedDevices") or {}).items()))
        tiles = [t for ids in (st.get("allocatedTiles") or {}).values() for t in ids]
        share = "; ".join(",".join(f"{k}={v}" for k, v in sorted(s.items()))
                          for s in ((g.get("spec") or {}).get("share") or {}).values())
        rows.append((g["metadata"]["namespace"], g["metadata"]["name"], st.get("phase", "-"),
                     st.get("nodeName", "-"), devices or "-",
                     share + (f"@{','.join(tiles)}" if tiles else "") or "whole",  # tiles=1@0.1: tile 0.1
                     ",".join(st.get("members") or []) or "-"))
    inspect_cmd.print_table(rows, out)


def _on_claim(pod: Mapping[str, Any]) -> bool:
    """Wired by the webhook to its group's ResourceClaim (CONTRACT §13)."""
    return any(c.get("name") == names.POD_CLAIM_NAME for c in (pod.get("spec") or {}).get("resourceClaims") or [])


def _print_pods(sandbox: Sandbox, pods: Sequence[tuple[str, str]], out: Any) -> None:
    rows = [("NAMESPACE", "POD", "GROUP", "NODE", "PHASE", "HANDOVER", "ENV THE CONTAINERS SEE")]
    for ns, name in pods:
        pod = sandbox.get("pods", name, ns) or {}
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        env = sorted(f"{k}={v}" for k, v in names.env_from_annotations(ann).items())
        wired = _wired_env(pod)
        shown = [e for e in env if e.split("=", 1)[0] in wired] or ["(not wired)"]
        handover = handoverview.of_pod(pod).split(" ")[0] if names.POD_SELECTED_DEVICES_ANNOTATION in ann else "-"
        if _on_claim(pod):  # a DRA group's member: no env var, the driver hands the claim's devices over by CDI
            handover, shown = "dra", ["(none: the claim's CDI devices, below)"]
        rows.append((ns, name, ann.get(names.POD_GROUP_ANNOTATION, "-"), (pod.get("spec") or {}).get("nodeName", "-"),
                     (pod.get("status") or {}).get("phase", "-"), handover, " ".join(shown)))
    inspect_cmd.print_table(rows, out)


def _print_claims(sandbox: Sandbox, out: Any) -> None:
    """Each DRA group's ResourceClaim as the API shows it, and the CDI devices each member's containers got from the
    driver when the kubelet started them (none while the claim is not allocated and reserved for the pod)."""
    claims = sorted((claimview.of_claim(c) for c in sandbox.list("resourceclaims")),
                    key=lambda c: (c.namespace, c.group))
    rows: list[tuple[str, ...]] = [("NAMESPACE", "GROUP", "CLAIM", "STATE", "NODE", "DEVICES", "RESERVED FOR")]
    rows += [(c.namespace, c.group or "-", c.name, c.state, c.node or "-", ",".join(c.devices) or "-",
              ",".join(c.reserved_for) or "-") for c in claims]
    inspect_cmd.print_table(rows, out)
    print(file=out)
    rows = [("NAMESPACE", "POD", "CONTAINER", "CDI DEVICES FROM THE DRA DRIVER")]
    started_cdi = sandbox.kubelet.started_cdi if sandbox.kubelet is not None else {}
    for c in claims:
        for pod in sandbox.list("pods", c.namespace):
            if ((pod["metadata"].get("annotations") or {}).get(names.POD_GROUP_ANNOTATION)) != c.group:
                continue
            started = started_cdi.get((c.namespace, pod["metadata"]["name"])) or {}
            for container in (pod.get("spec") or {}).get("containers") or []:
                rows.append((c.namespace, pod["metadata"]["name"], container["name"],
                             " ".join(started.get(container["name"], ())) or "(not started: claim not allocated "
                             "and reserved for it yet)"))
    inspect_cmd.print_table(rows, out)


def _wired_env(pod: dict[str, Any]) -> set[str]:
    """Env vars the webhook wired to our annotations (downward API), in any container."""
    wired = set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        for e in c.get("env") or []:
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            if names.POD_ENV_ANNOTATION_PREFIX in path:
                wired.add(e["name"])
    return wired
