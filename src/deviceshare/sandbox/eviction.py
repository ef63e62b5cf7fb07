"""The Eviction API: ``POST /api/v1/namespaces/NS/pods/NAME/eviction``, as kube-apiserver answers it.

The body is a policy/v1 (or policy/v1beta1) ``Eviction`` naming the pod, with optional
``deleteOptions``. In the order of the real handler (pkg/registry/core/pod/storage/eviction.go):

1. a pod that is Pending, finished or already being deleted is deleted without asking any budget;
2. a pod covered by more than one PodDisruptionBudget is refused with 500 and the real message;
3. a pod that is not Ready goes without using up a disruption when its budget is healthy anyway
   (``currentHealthy >= desiredHealthy > 0``) or says ``unhealthyPodEvictionPolicy: AlwaysAllow``;
4. otherwise its budget must allow a disruption: a budget the controller has not processed since its
   last change answers 429 (``Retry-After: 10``), one that allows none 429 with the cause
   ``The disruption budget NAME needs D healthy pods and has C currently``; else ``disruptionsAllowed``
   is decremented at once and the pod recorded in ``disruptedPods`` (the controller recounts later);
5. the pod gets the ``DisruptionTarget`` condition and is deleted *gracefully*: ``deletionTimestamp``
   set, ``deletionGracePeriodSeconds`` from the options or the pod's ``terminationGracePeriodSeconds``
   (30); the kubelet simulation stops it and removes it. Answer: 201 with a ``Success`` Status.

With ``dryRun=All`` every check is made and nothing is written. Admission sees the Eviction as a
CREATE of the ``pods/eviction`` subresource (policies and webhooks can match it; RBAC, which the
sandbox does not enforce, would ask for verb ``create`` on ``pods/eviction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import budgets, errors, registry, store

VERSIONS = ("policy/v1", "policy/v1beta1")
DEFAULT_GRACE_S = 30
MAX_DISRUPTED = 2000
SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
TOO_MANY = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def _too_many(cause: str, retry_after: int) -> errors.ApiError:
    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return errors.ApiError(429, "TooManyRequests", TOO_MANY, details=details, headers=headers)


def _check_body(name: str, body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping) or body.get("kind") != "Eviction" or body.get("apiVersion") not in VERSIONS:
        kind = body.get("kind") if isinstance(body, Mapping) else type(body).__name__
        raise errors.bad_request(f"not a Eviction object: {kind}")
    if store.meta(body).get("name") != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    if not isinstance(options, Mapping):
        raise errors.bad_request("deleteOptions must be an object")
    return options


def dry_run(body: Any) -> bool:
    """``dryRun=All`` on the request, or in the Eviction's ``deleteOptions`` (propagateDryRun)."""
    options = body.get("deleteOptions") if isinstance(body, Mapping) else None
    return store.DRY_RUN.get() or (isinstance(options, Mapping) and "All" in (options.get("dryRun") or []))


def _can_ignore_budgets(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return phase in ("Pending", "Succeeded", "Failed") or bool(store.meta(pod).get("deletionTimestamp"))


def evict(objects: store.ObjectStore, namespace: str, name: str, body: Any, dry_run: bool) -> dict[str, Any]:
    """Evict the pod or raise the API's refusal; the ``Success`` Status to answer with 201."""
    options = dict(_check_body(name, body))
    pods = objects.catalog.lookup("pods")
    pod = objects.get(pods, namespace, name)
    if _can_ignore_budgets(pod):
        return _delete(objects, pod, options, dry_run)
    rtype = objects.catalog.lookup("poddisruptionbudgets")
    covering = [b for b in objects.list_objects(rtype, namespace)[0] if budgets.selects(b, pod)]
    if len(covering) > 1:
        raise errors.ApiError(500, "", MULTIPLE)
    if not covering:
        return _delete(objects, pod, options, dry_run)
    budget = covering[0]
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    if not budgets.ready(pod):
        healthy_anyway = status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or healthy_anyway:
            return _delete(objects, pod, options, dry_run)
    budget_name = store.meta(budget)["name"]
    if int(status.get("observedGeneration", 0)) < int(store.meta(budget).get("generation", 1)):
        raise _too_many(f"The disruption budget {budget_name} is still being processed by the server.", 10)
    allowed = int(status.get("disruptionsAllowed", 0))
    if allowed < 0:
        raise errors.forbidden("poddisruptionbudgets", "policy", budget_name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED:
        raise errors.forbidden("poddisruptionbudgets", "policy", budget_name,
                               "DisruptedPods map too big - too many evictions not confirmed by PDB controller")
    if allowed == 0:
        raise _too_many(
            f"The disruption budget {budget_name} needs {status.get('desiredHealthy', 0)} healthy pods "
            f"and has {status.get('currentHealthy', 0)} currently", 0,
        )
    if not dry_run:
        def decrement(obj: dict[str, Any]) -> None:
            new = dict(obj.get("status") or {})
            new["disruptionsAllowed"] = allowed - 1
            new["disruptedPods"] = {**(new.get("disruptedPods") or {}), name: store.now()}
            if allowed - 1 == 0:
                generation = int(new.get("observedGeneration", 0))
                condition = budgets.allowed_condition(0, generation, new.get("conditions") or [], store.now())
                new["conditions"] = [*(c for c in new.get("conditions") or [] if c.get("type") != budgets.CONDITION),
                                     condition]
            obj["status"] = new

        objects.write_status(rtype, namespace, budget_name, decrement)
    return _delete(objects, pod, options, dry_run)


def _delete(objects: store.ObjectStore, pod: dict[str, Any], options: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """The pod marked ``DisruptionTarget`` and deleted, gracefully when it runs on a node."""
    if dry_run:
        return dict(SUCCESS)
    md = store.meta(pod)
    pods = objects.catalog.lookup("pods")
    registry.check_delete_preconditions(pods, md["name"], pod, options)
    running = bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")
    if running and not md.get("deletionTimestamp"):
        def target(obj: dict[str, Any]) -> None:
            store.set_condition(obj, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting")

        marked = objects.write_status(pods, md.get("namespace"), md["name"], target)
        if (options.get("preconditions") or {}).get("resourceVersion"):  # ours is the newer version now
            version = store.meta(marked)["resourceVersion"]
            options["preconditions"] = {**options["preconditions"], "resourceVersion": version}
    if "gracePeriodSeconds" not in options:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        options["gracePeriodSeconds"] = grace if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE_S
    objects.delete(pods, md.get("namespace"), md["name"], options)
    return dict(SUCCESS)

