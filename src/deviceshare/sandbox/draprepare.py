"""What the kubelet does for a pod with ``spec.resourceClaims`` before its containers start: prepare each claim
through its driver's kubelet plugin, and hand each container the CDI devices of the claims it names.

Read from kubernetes/kubernetes (2026), pkg/kubelet/cm/dra/manager.go ``PrepareResources`` and ``GetResources``,
and pkg/kubelet/kubelet.go, which records the failure as a Warning event ``FailedPrepareDynamicResources``,
``Failed to prepare dynamic resources: <error>``, and retries (the pod stays Pending). The errors, in order:

- (staging/src/k8s.io/dynamic-resource-allocation/resourceclaim) a claim from a template that the pod's
  ``status.resourceClaimStatuses`` does not name yet: ``pod "<ns>/<pod>": ResourceClaim not created yet``; one
  that the pod does not control: ``ResourceClaim <ns>/<claim> was not created for pod <ns>/<pod> (pod is not
  owner)``; a pod claim naming neither: ``pod "<ns>/<pod>", spec.resourceClaim "<name>": none of the supported
  fields are set``;
- ``fetch ResourceClaim <claim>: resourceclaims.resource.k8s.io "<claim>" not found``;
- ``pod <pod> (<uid>) is not allowed to use ResourceClaim <claim> (<uid>)``: the pod is not in ``reservedFor``;
- ``DRA driver <driver> is not registered``: no plugin of a result's driver on this node;
- ``NodePrepareResources failed for ResourceClaim <claim>: <the driver's error>`` (dradriver.prepare's words),
  among them a device already prepared on the node for another claim.

One check is the sandbox's own: a claim whose ``status.allocation.nodeSelector`` does not match the node fails
with ``ResourceClaim <claim> is allocated for other nodes: ...``. The real kubelet trusts the scheduler there
(and NVIDIA's plugin would prepare its own device of the same name); the sandbox stands in for a cluster whose
scheduler is deviceshare itself, so such a binding is a bug it must show.

GetResources: a container gets the CDI devices of every pod claim its ``resources.claims`` names (only those of
one request when the entry names a ``request``). They reach the container runtime (CRI ``CDIDevices``), not the
API, so the sandbox's kubelet keeps them in ``Kubelet.started_cdi`` as it keeps the env a container saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.core import filters, inventory
from deviceshare.sandbox import dra, dradriver, errors, store

FAILED = "FailedPrepareDynamicResources"


class PrepareError(Exception):
    """Preparing failed; the message is the error the kubelet's event shows."""


def claim_name(pod: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> tuple[str | None, bool]:
    """resourceclaim.Name: the claim's name (None: nothing to prepare) and whether the pod must own it."""
    md = store.meta(pod)
    if pod_claim.get("resourceClaimName"):
        return str(pod_claim["resourceClaimName"]), False
    if not pod_claim.get("resourceClaimTemplateName"):
        raise PrepareError(f'pod "{md.get("namespace")}/{md.get("name")}", spec.resourceClaim '
                           f'"{pod_claim.get("name")}": none of the supported fields are set')
    for entry in dra.listed(dra.mapping(pod.get("status")).get("resourceClaimStatuses")):
        if dra.mapping(entry).get("name") == pod_claim.get("name"):
            name = dra.mapping(entry).get("resourceClaimName")
            return (str(name) if name else None), True
    raise PrepareError(f'pod "{md.get("namespace")}/{md.get("name")}": ResourceClaim not created yet')


def allocated_for(claim: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the allocation's ``nodeSelector`` (none: every node) selects ``node``."""
    selector = dra.mapping(dra.mapping(claim.get("status")).get("allocation")).get("nodeSelector")
    if selector is None:
        return True
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}
    terms = inventory.pod_demand({"spec": {"affinity": affinity}}).required_terms
    md = store.meta(node)
    return any(filters.term_matches(term, md["name"], md.get("labels") or {}) for term in terms)


def prepare(
    objects: store.ObjectStore, pod: Mapping[str, Any], node: Mapping[str, Any], drivers: Mapping[str, set[str]],
    checkpoint: dradriver.Checkpoint,
) -> dict[str, list[str]]:
    """Prepare every claim of ``pod`` on ``node``: its pod-claim name -> the CDI devices per request name
    flattened (``name`` and ``name/request`` keys). ``drivers``: the plugins registered on this node, each
    with the devices it has; ``checkpoint``: what they prepared, where the pod's claims are added once all are
    prepared. PrepareError when the pod must not start yet."""
    claims_type = objects.catalog.lookup("resourceclaims")
    md, node_name = store.meta(pod), store.meta(node)["name"]
    prepared: dict[str, list[str]] = {}
    done: list[tuple[str, set[str]]] = []
    for pod_claim in dra.listed(dra.mapping(pod.get("spec")).get("resourceClaims")):
        pod_claim = dra.mapping(pod_claim)
        name, must_own = claim_name(pod, pod_claim)
        if name is None:
            continue
        try:
            claim = objects.get(claims_type, md.get("namespace"), name)
        except errors.ApiError as e:
            raise PrepareError(f"fetch ResourceClaim {name}: {e.message}") from e
        if must_own and not any(ref.get("uid") == md.get("uid") and ref.get("controller")
                                for ref in store.meta(claim).get("ownerReferences") or []):
            ns = md.get("namespace")
            raise PrepareError(f"ResourceClaim {ns}/{name} was not created for pod {ns}/{md.get('name')} "
                               "(pod is not owner)")
        claim_uid = store.meta(claim).get("uid")
        reserved = dra.listed(dra.mapping(claim.get("status")).get("reservedFor"))
        if not any(dra.mapping(r).get("uid") == md.get("uid") for r in reserved):
            raise PrepareError(f"pod {md.get('name')} ({md.get('uid')}) is not allowed to use "
                               f"ResourceClaim {name} ({claim_uid})")
        if not allocated_for(claim, node):
            raise PrepareError(f"ResourceClaim {name} is allocated for other nodes: "
                               f'status.allocation.nodeSelector does not match node "{node_name}"')
        results = dra.listed(dra.mapping(dra.mapping(claim["status"].get("allocation")).get("devices"))
                             .get("results"))
        for driver in sorted({str(dra.mapping(r).get("driver")) for r in results}):
            if driver not in drivers:
                raise PrepareError(f"DRA driver {driver} is not registered")
        devices: list[str] = []
        try:
            devices += dradriver.prepare(claim, node_name, drivers.get(dradriver.DRIVER, set()),
                                         checkpoint.others(node_name, str(claim_uid)))
        except ValueError as e:
            raise PrepareError(f"NodePrepareResources failed for ResourceClaim {name}: {e}") from e
        prepared[str(pod_claim.get("name"))] = devices
        by_request: dict[str, list[str]] = {}
        for result, cdi in zip([r for r in results if dra.mapping(r).get("driver") == dradriver.DRIVER],
                               devices, strict=True):
            by_request.setdefault(str(dra.mapping(result).get("request")), []).append(cdi)
        for request, ids in by_request.items():
            prepared[f"{pod_claim.get('name')}/{request}"] = ids
        done.append((str(claim_uid), dradriver.exclusive_devices(claim)))
    for claim_uid, exclusive in done:
        checkpoint.add(node_name, claim_uid, exclusive, (str(md.get("namespace", "")), str(md["name"])))
    return prepared


def container_devices(container: Mapping[str, Any], prepared: Mapping[str, list[str]]) -> list[str]:
    """GetResources: the CDI devices of the claims (or claim requests) the container names."""
    devices: list[str] = []
    for entry in dra.listed(dra.mapping(container.get("resources")).get("claims")):
        entry = dra.mapping(entry)
        key = f"{entry.get('name')}/{entry['request']}" if entry.get("request") else str(entry.get("name"))
        devices += prepared.get(key, [])
    return devices
