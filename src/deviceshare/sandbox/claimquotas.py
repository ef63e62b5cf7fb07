"""ResourceQuota for ResourceClaims, as kube-apiserver and kube-controller-manager keep it (resource.k8s.io/v1).

What a claim costs is the claim evaluator's ``Usage`` (kubernetes pkg/quota/v1/evaluator/core/resource_claims.go):
1 of ``count/resourceclaims.resource.k8s.io``, and per request on ``<class>.deviceclass.resource.k8s.io/devices``
its ``exactly.count`` (``allocationMode: ExactCount``) or 32 (``All``, AllocationResultsMaxSize), a
``firstAvailable`` list its largest alternative per class, an unknown mode nothing. The names the
``DRAExtendedResource`` gate adds (``requests.deviceclass.resource.kubernetes.io/<class>``, ``requests.<extended
resource>``) are not emulated.

- **Admission** (:func:`admit`, the ResourceQuota plugin's ``checkRequest`` in
  staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go): a claim CREATE is checked against
  every unscoped quota of its namespace that limits a name it costs (the evaluator's ``MatchingScopes`` is empty: a
  scoped quota never matches a claim); over ``hard`` is 403 ``exceeded quota: <quota>, requested: <name>=<n>,
  used: <name>=<n>, limited: <name>=<n>``, otherwise the quota's ``status.used`` goes up before the claim is stored.
  Status writes of a claim are not charged (``Handles``: no subresource), nor is an UPDATE here (a claim's spec
  does not change).
- **The quota controller** (:class:`ClaimQuotaController`, kube-controller-manager's resourcequota controller for
  these names): ``status.hard`` mirrors ``spec.hard`` and ``status.used`` is counted again from the stored claims
  when a quota changes and when a claim is deleted (its replenishment), so a deleted claim frees its devices at
  once. Other names in ``status.used`` (pods, CPU) are left as they are: the sandbox does not emulate their quota.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from deviceshare.core import inventory
from deviceshare.sandbox import dra, errors, store

COUNT = "count/resourceclaims.resource.k8s.io"
PER_CLASS = ".deviceclass.resource.k8s.io/devices"  # corev1.ResourceClaimsPerClass
ALL_DEVICES = 32  # resourceapi.AllocationResultsMaxSize: what allocationMode All may take at most


def usage(claim: Mapping[str, Any]) -> dict[str, int]:
    """The claim evaluator's Usage of one claim."""
    used = {COUNT: 1}
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alternatives = request.get("firstAvailable") or ([request["exactly"]] if request.get("exactly") else [])
        most: dict[str, int] = {}
        for sub in alternatives:
            name = f"{sub.get('deviceClassName', '')}{PER_CLASS}"
            mode = sub.get("allocationMode") or "ExactCount"
            devices = int(sub.get("count") or 1) if mode == "ExactCount" else ALL_DEVICES if mode == "All" else 0
            most[name] = max(most.get(name, 0), devices)
        for name, devices in most.items():
            used[name] = used.get(name, 0) + devices
    return used


def _tracked(hard: Mapping[str, Any]) -> dict[str, int]:
    """The claim names a quota limits (the evaluator's MatchingResources), as counts."""
    out: dict[str, int] = {}
    for name, quantity in hard.items():
        if name == COUNT or str(name).endswith(PER_CLASS):
            with contextlib.suppress(ValueError, TypeError):
                out[str(name)] = inventory.parse_memory(quantity)
    return out


def _quotas(objects: store.ObjectStore, namespace: str) -> list[dict[str, Any]]:
    listed, _ = objects.list_objects(objects.catalog.lookup("resourcequotas"), namespace)
    return [q for q in listed if not any((q.get("spec") or {}).get(k) for k in ("scopes", "scopeSelector"))]


def _counted(objects: store.ObjectStore, namespace: str) -> dict[str, int]:
    """What the namespace's stored claims cost together."""
    total: dict[str, int] = {}
    claims, _ = objects.list_objects(objects.catalog.lookup("resourceclaims"), namespace, copied=False)
    for claim in claims:
        for name, n in usage(claim).items():
            total[name] = total.get(name, 0) + n
    return total


def admit(objects: store.ObjectStore, namespace: str, claim: Mapping[str, Any]) -> None:
    """The ResourceQuota plugin on a claim CREATE: refused (403) over a quota, else charged to ``status.used``."""
    delta, used = usage(claim), _counted(objects, namespace)
    charged: list[tuple[dict[str, Any], dict[str, int]]] = []
    for quota in _quotas(objects, namespace):
        hard = _tracked((quota.get("spec") or {}).get("hard") or {})
        requested = {n: delta[n] for n in hard if delta.get(n)}
        exceeded = sorted(n for n, want in requested.items() if used.get(n, 0) + want > hard[n])
        if exceeded:
            name = store.meta(quota)["name"]
            raise errors.forbidden("resourceclaims", dra.GROUP, str(store.meta(claim).get("name", "")),
                                   f"exceeded quota: {name}, requested: {_shown(requested, exceeded)}, used: "
                                   f"{_shown(used, exceeded)}, limited: {_shown(hard, exceeded)}")
        charged.append((quota, {n: used.get(n, 0) + requested.get(n, 0) for n in hard}))
    for quota, now in charged if not store.DRY_RUN.get() else ():  # a dry run charges nothing (req.DryRun)
        _write_used(objects, quota, now)


def _shown(values: Mapping[str, int], names: list[str]) -> str:
    """The plugin's prettyPrint: ``name=value`` sorted by name, comma-joined."""
    return ",".join(f"{n}={values.get(n, 0)}" for n in names)


def _write_used(objects: store.ObjectStore, quota: Mapping[str, Any], used: Mapping[str, int]) -> None:
    hard = dict((quota.get("spec") or {}).get("hard") or {})
    status = dict(quota.get("status") or {})
    wanted = {**status, "hard": hard, "used": {**(status.get("used") or {}), **{n: str(v) for n, v in used.items()}}}
    if wanted != quota.get("status"):
        md = store.meta(quota)
        with contextlib.suppress(errors.ApiError):
            objects.write_status(objects.catalog.lookup("resourcequotas"), md.get("namespace", ""), md["name"],
                                 lambda obj: obj.update(status=wanted))


class ClaimQuotaController:
    """The quota controller for claims: ``status`` counted again when a quota changes or a claim goes."""

    def __init__(self, objects: store.ObjectStore) -> None:
        self.store = objects
        self._quotas = objects.catalog.lookup("resourcequotas")
        self._claims = objects.catalog.lookup("resourceclaims")
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.listeners.append(self._on_event)
        for namespace in {store.meta(q).get("namespace", "") for q in self.store.list_objects(self._quotas)[0]}:
            self._recount(namespace)

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)

    def _on_event(self, event: store.WatchEvent) -> None:
        namespace = store.meta(event.obj).get("namespace", "")
        quota_spec = event.key == self._quotas.key and event.type != "DELETED"
        if (quota_spec or (event.key == self._claims.key and event.type == "DELETED")) and self._loop is not None:
            self._loop.call_soon(self._recount, namespace)  # outside the write that told us

    def _recount(self, namespace: str) -> None:
        counted = _counted(self.store, namespace)
        for quota in _quotas(self.store, namespace):
            hard = _tracked((quota.get("spec") or {}).get("hard") or {})
            _write_used(self.store, quota, {n: counted.get(n, 0) for n in hard})
