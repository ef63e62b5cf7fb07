"""PodDisruptionBudget arithmetic (policy/v1), as kube-controller-manager's disruption controller does it.

Pure functions of a budget and the pods it selects, so the disruption controller (:mod:`disruption`,
which keeps ``status`` up to date) and the Eviction API (:mod:`eviction`, which reads it) agree:

- a budget selects the pods of its namespace matching ``spec.selector`` (policy/v1: an empty selector
  selects every pod, an absent one none);
- ``minAvailable: N`` wants N healthy pods of the pods it selects; a percentage, or ``maxUnavailable``,
  counts against the scale of the pods' controllers (Deployment, ReplicaSet, StatefulSet), rounded up;
  pods without a controller count for nothing there, and a controller that has no scale is an error
  (the status then allows no disruption, condition ``SyncFailed``);
- healthy = Ready, not being deleted, not evicted within the last two minutes (``disruptedPods``);
- ``disruptionsAllowed = currentHealthy - desiredHealthy`` (never below 0, and 0 while it selects no pod).

Sources read: pkg/controller/disruption/disruption.go, pkg/apis/policy/validation,
k8s.io/component-helpers/apps/poddisruptionbudget.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from deviceshare.sandbox import errors, selectors

Obj = Mapping[str, Any]
KEY = ("policy", "poddisruptionbudgets")
DELETION_TIMEOUT_S = 120  # how long an evicted pod counts as disrupted before the controller gives up on it
CONDITION = "DisruptionAllowed"
_PERCENT = re.compile(r"^[0-9]+%$")
EMPTY_STATUS = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}


def _meta(obj: Obj) -> Mapping[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def selects(budget: Obj, pod: Obj) -> bool:
    """Does ``budget`` cover ``pod``? (Same namespace, selector matches; an invalid selector matches none.)"""
    if _meta(budget).get("namespace") != _meta(pod).get("namespace"):
        return False
    selector = (budget.get("spec") or {}).get("selector")
    if selector is None:
        return False
    try:
        return selectors.from_object(selector).matches(_meta(pod).get("labels"))
    except errors.ApiError:
        return False


def _int_or_percent(value: Any, field: str) -> list[tuple[str, str]]:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return [(field, f"Invalid value: {value!r}: must be an integer or percentage (e.g '5%')")]
    if isinstance(value, int):
        return [] if value >= 0 else [(field, f"Invalid value: {value}: must be greater than or equal to 0")]
    if not _PERCENT.match(value):
        return [(field, f'Invalid value: "{value}": must be an integer or percentage (e.g \'5%\')')]
    if int(value[:-1]) > 100:
        return [(field, f'Invalid value: "{value}": must not be greater than 100%')]
    return []


def validate(budget: Obj) -> list[tuple[str, str]]:
    """ValidatePodDisruptionBudgetSpec: (field, message) causes, empty when valid."""
    spec = budget.get("spec") or {}
    causes: list[tuple[str, str]] = []
    if "minAvailable" in spec and "maxUnavailable" in spec:
        causes.append(("spec", "Invalid value: policy.PodDisruptionBudgetSpec{...}: "
                               "minAvailable and maxUnavailable cannot be both set"))
    for field in ("minAvailable", "maxUnavailable"):
        if field in spec:
            causes += _int_or_percent(spec[field], f"spec.{field}")
    selector = spec.get("selector")
    if selector is not None:
        try:
            selectors.from_object(selector)
        except errors.ApiError as e:
            causes.append(("spec.selector", f"Invalid value: {e.message}"))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("AlwaysAllow", "IfHealthyBudget"):
        causes.append(("spec.unhealthyPodEvictionPolicy",
                       f'Unsupported value: "{policy}": supported values: "AlwaysAllow", "IfHealthyBudget"'))
    return causes


def ready(pod: Obj) -> bool:
    """podutil.IsPodReady."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def scaled(value: int | str, total: int, round_up: bool = True) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    exact = int(value[:-1]) * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def controller_of(pod: Obj) -> Mapping[str, Any] | None:
    return next((r for r in _meta(pod).get("ownerReferences") or [] if r.get("controller")), None)


ScaleOf = Callable[[Mapping[str, Any], str], int | None]  # (controllerRef, namespace) -> its replicas, None: no scale


def expected_and_desired(budget: Obj, pods: Sequence[Obj], scale_of: ScaleOf) -> tuple[int, int]:
    """(expectedPods, desiredHealthy); ValueError naming the pod whose controller has no scale."""
    spec = budget.get("spec") or {}
    if "maxUnavailable" not in spec and isinstance(spec.get("minAvailable"), int):
        return len(pods), int(spec["minAvailable"])
    if "maxUnavailable" not in spec and "minAvailable" not in spec:
        return 0, 0
    scales: dict[str, int] = {}
    for pod in pods:
        ref = controller_of(pod)
        if ref is None or ref.get("uid") in scales:
            continue  # an unmanaged pod counts for nothing in a scale
        found = scale_of(ref, str(_meta(pod).get("namespace", "")))
        if found is None:
            raise ValueError(f'found no controllers for pod "{_meta(pod).get("name")}"')
        scales[str(ref.get("uid"))] = found
    expected = sum(scales.values())
    if "maxUnavailable" in spec:
        return expected, max(0, expected - scaled(spec["maxUnavailable"], expected))
    return expected, scaled(spec["minAvailable"], expected)


def parse_time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def disrupted(budget: Obj, pods: Iterable[Obj], now: datetime.datetime) -> tuple[dict[str, str], float | None]:
    """The ``disruptedPods`` still pending deletion, and the seconds until the first of them expires."""
    recorded = (budget.get("status") or {}).get("disruptedPods") or {}
    kept: dict[str, str] = {}
    recheck: float | None = None
    for pod in pods:
        name = _meta(pod).get("name", "")
        if _meta(pod).get("deletionTimestamp") or name not in recorded:
            continue
        left = (parse_time(recorded[name]) - now).total_seconds() + DELETION_TIMEOUT_S
        if left > 0:
            kept[name] = recorded[name]
            recheck = left if recheck is None else min(recheck, left)
    return kept, recheck


def allowed_condition(allowed: int, generation: int, old: Iterable[Mapping[str, Any]], now: str,
                      failure: str | None = None) -> dict[str, Any]:
    """pdbhelper.UpdateDisruptionAllowedCondition (or the fail-safe's SyncFailed)."""
    status, reason = ("True", "SufficientPods") if allowed > 0 else ("False", "InsufficientPods")
    if failure is not None:
        status, reason = "False", "SyncFailed"
    previous = next((c for c in old if c.get("type") == CONDITION), None)
    changed = previous is None or previous.get("status") != status
    condition = {
        "type": CONDITION, "status": status, "reason": reason, "message": failure or "",
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),  # type: ignore[union-attr]
    }
    return condition


def status_of(
    budget: Obj, pods: Sequence[Obj], scale_of: ScaleOf, now: datetime.datetime
) -> tuple[dict[str, Any], float | None]:
    """The status the disruption controller writes, and when to look again (a disrupted pod expiring)."""
    generation = int(_meta(budget).get("generation", 1))
    old = (budget.get("status") or {}).get("conditions") or []
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        expected, desired = expected_and_desired(budget, pods, scale_of)
    except ValueError as e:  # failSafe: allow nothing, say why
        failed = dict(budget.get("status") or EMPTY_STATUS)
        failed["disruptionsAllowed"] = 0
        failed["conditions"] = [allowed_condition(0, generation, old, stamp, str(e))]
        return failed, None
    kept, recheck = disrupted(budget, pods, now)
    healthy = sum(
        1 for p in pods if not _meta(p).get("deletionTimestamp") and _meta(p).get("name") not in kept and ready(p)
    )
    allowed = healthy - desired if expected > 0 else 0
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "disruptionsAllowed": max(0, allowed),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [allowed_condition(max(0, allowed), generation, old, stamp)],
    }
    if kept:
        status["disruptedPods"] = kept
    return status, recheck
