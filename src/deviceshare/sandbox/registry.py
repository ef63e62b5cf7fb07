"""The generic registry's rules for one write, as pure functions of the stored and the written object.

Before anything reaches etcd, kube-apiserver's generic registry decides what a PUT, PATCH, binding or
delete may do: preconditions (409), immutable metadata, the ``status`` split, no new finalizers on an
object being deleted, ``generation`` bumped by spec changes only. Those rules live here, apart from
the store that files the result, so each reads on its own and the store reads as the order of a write.
Kind-specific rules (a pod's spec, a CRD's schema) are in ``strategies``.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.sandbox import catalog, errors, strategies

Obj = dict[str, Any]
clone = strategies.clone
meta = strategies.meta

_IMMUTABLE = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "name",
    "namespace",
)


def for_create(
    rtype: catalog.ResourceType, namespace: str | None, body: Mapping[str, Any], namespace_exists: Callable[[str], bool]
) -> Obj:
    """A copy of a create's body placed in its namespace and named (``generateName`` filled in)."""
    obj: Obj = clone(dict(body))
    md = obj.setdefault("metadata", {})
    if not isinstance(md, dict):
        raise errors.bad_request("metadata must be an object")
    if rtype.namespaced:
        ns = namespace or md.get("namespace") or "default"
        if md.get("namespace") and md["namespace"] != ns:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if not namespace_exists(ns):
            raise errors.not_found("namespaces", "", ns)
        md["namespace"] = ns
    else:
        md.pop("namespace", None)
    if not md.get("name") and md.get("generateName"):
        md["name"] = md["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
    if not md.get("name"):
        raise errors.invalid(
            rtype.kind,
            rtype.group,
            "",
            [("metadata.name", "Required value: name or generateName is required")],
        )
    return obj


def stamped_for_create(rtype: catalog.ResourceType, obj: Obj) -> Obj:
    """A new object as the registry files it: its kind, a fresh uid, creationTimestamp and generation 1,
    prepared and validated by its kind's strategy (the store gives it its resourceVersion)."""
    md = meta(obj)
    obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
    for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
        md.pop(field, None)
    md.update(uid=str(uuid.uuid4()), creationTimestamp=strategies.now(), generation=1)
    obj = strategies.prepare_for_create(rtype, obj)
    return strategies.validated(rtype, obj, None)


def check_create(rtype: catalog.ResourceType, namespace: str | None, body: Mapping[str, Any]) -> None:
    """Raise what a create would refuse in the object itself (its name, schema, CEL rules), storing nothing.
    kube-apiserver's store.create runs rest.BeforeCreate (the strategy's validation) before the validating
    admission webhooks and policies (k8s.io/apiserver registry/generic/registry/store.go), so a malformed
    object is answered by its schema, never by a webhook that parses it. (A missing namespace is the
    store's to report.)"""
    stamped_for_create(rtype, for_create(rtype, namespace, body, lambda _: True))


def check_update(rtype: catalog.ResourceType, old: Obj, new: Obj) -> None:
    """As :func:`check_create`, for an update (rest.BeforeUpdate before the update's validating admission)."""
    validated_update(rtype, old, clone(new))


def replacement(rtype: catalog.ResourceType, name: str, body: Any) -> Obj:
    """The object a PUT to ``name`` asks to store, checked against the URL."""
    new: Obj = clone(dict(body))
    if meta(new).get("name", name) != name:
        raise errors.bad_request(
            f"the name of the object ({meta(new).get('name')}) does not match the name on the URL ({name})"
        )
    if rtype.custom and not meta(new).get("resourceVersion"):  # CRs allow no unconditional update
        raise errors.invalid(
            rtype.kind,
            rtype.group,
            name,
            [("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")],
        )
    return new


def check_precondition(rtype: catalog.ResourceType, old: Obj, new: Obj) -> None:
    wanted = meta(new).get("resourceVersion")
    if wanted and str(wanted) != meta(old)["resourceVersion"]:
        raise errors.conflict(rtype.plural, rtype.group, meta(old)["name"], errors.STALE)


def merged(rtype: catalog.ResourceType, old: Obj, new: Obj, subresource: str | None) -> Obj:
    """The object a write of ``new`` to ``subresource`` stores (status split, immutable fields)."""
    if subresource == "ephemeralcontainers":  # only spec.ephemeralContainers changes through it
        containers = (new.get("spec") or {}).get("ephemeralContainers")
        new = clone(old)
        new.setdefault("spec", {})["ephemeralContainers"] = containers
        if containers is None:
            new["spec"].pop("ephemeralContainers")
    elif subresource == "status":
        status = new.get("status")
        new = clone(old)
        if status is None:
            new.pop("status", None)
        else:
            new["status"] = status
    else:
        new.setdefault("metadata", {})
        if rtype.has_status:
            if "status" in old:
                new["status"] = clone(old["status"])
            else:
                new.pop("status", None)
        if rtype.key == ("", "pods"):
            strategies.check_pod_update(old, new)
    old_md, new_md = meta(old), meta(new)
    for field in _IMMUTABLE:
        if field in old_md:
            new_md[field] = old_md[field]
        else:
            new_md.pop(field, None)
    if old_md.get("deletionTimestamp"):
        added = set(new_md.get("finalizers") or []) - set(old_md.get("finalizers") or [])
        if added:
            raise errors.invalid(
                rtype.kind,
                rtype.group,
                old_md["name"],
                [
                    (
                        "metadata.finalizers",
                        f"Forbidden: no new finalizers can be added if the object is being "
                        f"deleted, found new finalizers {sorted(added)!r}",
                    )
                ],
            )
    new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
    return new


def validated_update(rtype: catalog.ResourceType, old: Obj, new: Obj) -> Obj:
    """``new`` validated, with the old resourceVersion and the generation bumped if the spec changed."""
    new = strategies.validated(rtype, new, old)
    new_md = meta(new)
    new_md["resourceVersion"] = meta(old)["resourceVersion"]
    new_md["generation"] = meta(old).get("generation", 1)
    if _spec_part(new) != _spec_part(old):
        new_md["generation"] = int(meta(old).get("generation", 1)) + 1
    return new


def check_delete_preconditions(
    rtype: catalog.ResourceType, name: str, old: Obj, options: Mapping[str, Any] | None
) -> None:
    pre = (options or {}).get("preconditions") or {}
    md = meta(old)
    if pre.get("uid") and pre["uid"] != md.get("uid"):
        raise errors.conflict(
            rtype.plural,
            rtype.group,
            name,
            f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {md.get('uid')}",
        )
    if pre.get("resourceVersion") and str(pre["resourceVersion"]) != md["resourceVersion"]:
        raise errors.conflict(rtype.plural, rtype.group, name, errors.STALE)


def grace_period(rtype: catalog.ResourceType, old: Obj, options: Mapping[str, Any] | None) -> int:
    """Seconds a deleted pod is given to stop (its kubelet then removes it); 0: gone at once.

    As the pod strategy's CheckGracefulDelete, for a pod that runs on a node, but only when the delete
    asks for a grace period (the Eviction API does): a plain DELETE still removes a pod at once here."""
    wanted = (options or {}).get("gracePeriodSeconds")
    if rtype.key != ("", "pods") or not isinstance(wanted, int) or isinstance(wanted, bool) or wanted <= 0:
        return 0
    if not (old.get("spec") or {}).get("nodeName") or (old.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    return wanted


def terminating(old: Obj, grace_s: int) -> Obj:
    """The object being deleted: ``deletionTimestamp`` (now plus the grace period) and the period."""
    new = clone(old)
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace_s)
    meta(new).update(deletionTimestamp=moment.strftime("%Y-%m-%dT%H:%M:%SZ"), deletionGracePeriodSeconds=grace_s)
    return new


def orphans(options: Mapping[str, Any] | None) -> bool:
    """Whether a delete leaves the dependents in place instead of collecting them."""
    return bool((options or {}).get("propagationPolicy") == "Orphan" or (options or {}).get("orphanDependents"))


def bound(old: Obj, name: str, binding: Mapping[str, Any]) -> Obj:
    """The pod after ``pods/binding``: ``spec.nodeName`` set once, a second binding is a 409."""
    target = (binding.get("target") or {}).get("name")
    if not target:
        raise errors.invalid("Binding", "", name, [("target.name", "Required value")])
    already = old.get("spec", {}).get("nodeName")
    if already:
        raise errors.conflict("pods/binding", "", name, f'pod {name} is already assigned to node "{already}"')
    uid = meta(binding).get("uid")
    if uid and uid != meta(old).get("uid"):
        raise errors.conflict("pods/binding", "", name, "Precondition failed: UID mismatch")
    new = clone(old)
    new.setdefault("spec", {})["nodeName"] = target
    annotations = meta(binding).get("annotations") or {}
    if annotations:
        meta(new).setdefault("annotations", {}).update(annotations)
    strategies.set_condition(new, "PodScheduled", "True")
    return new


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}
