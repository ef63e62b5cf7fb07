"""The admission decision for one pod: AdmissionReview in, AdmissionReview out (CONTRACT §3).

Pure: no I/O, no clock, no globals. Everything the decision needs arrives as arguments: the
review, a :class:`GroupView` answering from memory, the env-name mapping and the scheduler name.
The aiohttp server, TLS and the watch-backed cache live in other modules, and the tests call
:func:`review` directly.

A pod that names a group is mutated to (1) use the deviceshare scheduler, (2) carry the group
label, (3) read each visibility env var of the group's resource types from the downward API, and
(4) tolerate the shared-node taint (which the admission policy allows members only); a member of a DRA group
(CONTRACT §13) gets the group's ResourceClaim instead of env vars (:mod:`claimwiring`).
The patch only adds what is missing, so a reinvoked pod yields an empty patch; an env var that is
already present with exactly our ``valueFrom`` counts as present. Everything else the contract
forbids is denied with a message that names the container and the variable or resource at fault; those
rules live in :mod:`deviceshare.core.members`, so the operator runs the same ones before it binds.
The webhook never writes to the API, so ``dryRun`` requests are answered exactly like real ones.
Nothing here reads a field before :mod:`reviews` has checked its type: a malformed review raises
:class:`MalformedReview` naming the field, never a Python error.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from deviceshare.api import envnames, models, names
from deviceshare.core import capacity, placement
from deviceshare.core import members as member_rules
from deviceshare.webhooks import claimwiring, mpsclients, reviews

RETRY_MESSAGE = "deviceshare webhook is still loading groups; retry the pod creation"


class Unjoinable(enum.Enum):
    """Why a group that may exist cannot take a new member right now."""

    WARMING = "warming"  # the cache has not finished its first list: the answer is not known
    DELETING = "deleting"  # the group has a deletionTimestamp; a new member would hold it forever


WARMING = Unjoinable.WARMING
DELETING = Unjoinable.DELETING


class GroupView(Protocol):
    """What the decision needs to know about the cluster, answered from memory."""

    def group(self, namespace: str, name: str) -> models.GroupSpec | Unjoinable | None:
        """The group's spec, ``None`` if no such group exists, or why it cannot be joined."""

    def member_count(self, namespace: str, name: str) -> int:
        """Live pods (not terminated, not deleting) already labelled as members of the group."""


MalformedReview = reviews.MalformedReview  # a review with a uid, wrong inside: a denial with code 400


@dataclass(frozen=True)
class Decision:
    """Allowed with a JSONPatch (possibly empty), or denied with a message and HTTP code."""

    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    code: int = 200
    # Why, in one word, for metrics: skipped | unchanged | patched | denied | warming | malformed | error.
    outcome: str = "skipped"


def deny(message: str, *, code: int = 403, outcome: str = "denied") -> Decision:
    return Decision(allowed=False, message=message, code=code, outcome=outcome)


def review(
    body: Mapping[str, Any],
    lookup: GroupView,
    env_names: envnames.EnvNames,
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME,
    mps: mpsclients.MpsMount | None = None,
) -> dict[str, Any]:
    """The AdmissionReview response for an AdmissionReview request (raises :class:`MalformedReview`)."""
    return respond(body, decide(body, lookup, env_names, scheduler_name, mps))


def decide(
    body: Mapping[str, Any],
    lookup: GroupView,
    env_names: envnames.EnvNames,
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME,
    mps: mpsclients.MpsMount | None = None,
) -> Decision:
    """The decision alone (raises :class:`MalformedReview`). ``mps``: shares are enforced by the node's MPS
    daemon (``--mps-root``), so members of compute/memory shares get its pipe and shm (:mod:`mpsclients`)."""
    return decide_create(pod_create(body), lookup, env_names, scheduler_name, mps)


@dataclass(frozen=True, slots=True)
class PodCreate:
    """A pod CREATE whose fields have been checked: what the decision reads."""

    pod: Mapping[str, Any]
    namespace: str
    group_name: str | None  # the group it asks to join; None: it does not opt in


def pod_create(body: Mapping[str, Any]) -> PodCreate | None:
    """The pod a review creates, its shape checked (raises :class:`MalformedReview`); ``None`` when the
    review is no pod CREATE, which the webhook lets pass untouched."""
    request = reviews.request_of(body)
    kind = request["kind"]
    if request["operation"] != "CREATE" or kind.get("kind") != "Pod" or kind.get("group") or request.get("subResource"):
        return None
    pod = request.get("object")
    if pod is None:
        raise MalformedReview("request.object is missing: a pod CREATE carries the pod")
    reviews.check_pod(pod)
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    return PodCreate(pod, namespace, group_name_of(pod))


def decide_create(
    create: PodCreate | None,
    lookup: GroupView,
    env_names: envnames.EnvNames,
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME,
    mps: mpsclients.MpsMount | None = None,
) -> Decision:
    """The decision for a checked pod CREATE (``None``: nothing to decide)."""
    if create is None:
        return Decision(allowed=True, outcome="skipped")
    return mutate(create.pod, create.namespace, lookup, env_names, scheduler_name, mps)


def group_name_of(pod: Mapping[str, Any]) -> str | None:
    """The group a pod asks to join, or ``None`` if it does not opt in (the pod's shape is checked)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value: str | None = annotations.get(names.POD_GROUP_ANNOTATION)
    return value


def mutate(
    pod: Mapping[str, Any],
    namespace: str,
    lookup: GroupView,
    env_names: envnames.EnvNames,
    scheduler_name: str,
    mps: mpsclients.MpsMount | None = None,
) -> Decision:
    """The decision for a pod being created in ``namespace``."""
    group_name = group_name_of(pod)
    if group_name is None:
        return Decision(allowed=True, outcome="skipped")
    bad_name = member_rules.group_name_problem(group_name)
    if bad_name is not None:
        return deny(bad_name)
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return deny(
            f"pod already sets spec.nodeName={spec['nodeName']!r}; a pod in device group "
            f"{group_name!r} must be placed by {scheduler_name}, remove spec.nodeName"
        )
    group = lookup.group(namespace, group_name)
    if group is Unjoinable.WARMING:
        return deny(RETRY_MESSAGE, code=503, outcome="warming")
    if group is Unjoinable.DELETING:
        return deny(f"SharedDeviceGroup {group_name!r} is being deleted; pods can no longer join it")
    if group is None:
        return deny(f"SharedDeviceGroup {group_name!r} does not exist in namespace {namespace!r}")

    env = visibility_env(group, env_names)
    problem = next(member_rules.conflicts(member_rules.container_facts(spec), group.resources, env), None)
    problem = problem or claimwiring.problem(spec, group_name, group)
    if problem:
        return deny(problem)
    if group.max_members:
        members = lookup.member_count(namespace, group_name)
        if members + 1 > group.max_members:
            return deny(
                f"SharedDeviceGroup {group_name!r} already has {members} of its "
                f"maxMembers={group.max_members} members"
            )
    enforced = mps is not None and placement.needs_mps(capacity.shares_from_spec(group.share))
    if enforced:
        assert mps is not None
        mps_problem = mpsclients.problem(pod, mps)
        if mps_problem:
            return deny(mps_problem)
    patch = list(_patch(pod, group_name, env, scheduler_name))
    if group.is_dra:
        patch += claimwiring.patch(spec, group_name, pointer)
    if enforced:
        assert mps is not None
        patch += mpsclients.patch(pod, mps, pointer)
    return Decision(allowed=True, patch=patch, outcome="patched" if patch else "unchanged")


def visibility_env(group: models.GroupSpec, env_names: envnames.EnvNames) -> list[str]:
    """The env var names a group's members get, once each: visibility in resource order, then share limits."""
    return env_names.for_group(group)


SHARED_NODE_TOLERATION: Mapping[str, str] = {"key": names.SHARED_NODE_TAINT, "operator": "Exists"}


def tolerates_shared_nodes(tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a pod already carries exactly our toleration (so a reinvocation adds nothing)."""
    return any(
        t.get("key") == names.SHARED_NODE_TAINT and t.get("operator") == "Exists" and not t.get("effect")
        for t in tolerations
    )


def env_entry(env_name: str) -> dict[str, Any]:
    """The env entry the webhook injects for one visibility variable."""
    return member_rules.env_entry(env_name)


def is_injected(entry: Mapping[str, Any]) -> bool:
    """Whether an env entry is the one :func:`env_entry` makes (the API server may have defaulted
    ``fieldRef.apiVersion`` to ``v1`` since, or not)."""
    return member_rules.is_injected(entry)


def respond(body: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """Wrap a decision as the AdmissionReview response to ``body``."""
    api_version, request = reviews.envelope(body)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "message": decision.message,
            "reason": _REASONS.get(decision.code, "Forbidden"),
        }
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        raw = json.dumps(decision.patch, separators=(",", ":")).encode()
        response["patch"] = base64.b64encode(raw).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


# metav1.StatusReason by code, as kube-apiserver names them.
_REASONS = {400: "BadRequest", 500: "InternalError", 503: "ServiceUnavailable"}


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer: ``~`` becomes ``~0`` and ``/`` becomes ``~1`` in each part."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for list_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(list_name) or []):
            yield list_name, index, container


def _patch(
    pod: Mapping[str, Any], group_name: str, env: Sequence[str], scheduler_name: str
) -> Iterator[dict[str, Any]]:
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != scheduler_name:
        yield {"op": "add", "path": pointer("spec", "schedulerName"), "value": scheduler_name}
    labels = (pod.get("metadata") or {}).get("labels")
    if not labels:
        yield {
            "op": "add",
            "path": pointer("metadata", "labels"),
            "value": {names.POD_GROUP_LABEL: group_name},
        }
    elif labels.get(names.POD_GROUP_LABEL) != group_name:
        yield {"op": "add", "path": pointer("metadata", "labels", names.POD_GROUP_LABEL), "value": group_name}
    tolerations = spec.get("tolerations") or []
    if not tolerations:
        yield {"op": "add", "path": pointer("spec", "tolerations"), "value": [dict(SHARED_NODE_TOLERATION)]}
    elif not tolerates_shared_nodes(tolerations):
        yield {"op": "add", "path": pointer("spec", "tolerations", "-"), "value": dict(SHARED_NODE_TOLERATION)}
    for list_name, index, container in _containers(spec):
        present = {e.get("name") for e in container.get("env") or []}
        missing = [env_entry(n) for n in env if n not in present]
        if not missing:
            continue
        if not container.get("env"):
            yield {"op": "add", "path": pointer("spec", list_name, index, "env"), "value": missing}
        else:
            for entry in missing:
                yield {"op": "add", "path": pointer("spec", list_name, index, "env", "-"), "value": entry}
