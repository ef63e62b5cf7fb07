"""The yes/no questions kube-scheduler asks of a node, answered with a reason.

Each check returns ``None`` when the node passes, else the reason string from
:mod:`deviceshare.core.reasons`. :func:`first_failure` runs them in the documented order
(shared mode, ready, unschedulable, taints, pod affinity/selector, group selector, devices, cpu,
memory); a rejected node is counted under its first failing reason, as kube-scheduler does.
Placement and the per-member check share these, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from deviceshare.core import inventory, reasons

_FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule only affects scoring


def tolerates(toleration: inventory.Toleration, taint: inventory.Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return False


def untolerated(
    taints: Sequence[inventory.Taint], tolerations: Sequence[inventory.Toleration]
) -> inventory.Taint | None:
    """The first NoSchedule/NoExecute taint no toleration covers."""
    for taint in taints:
        if taint.effect in _FILTERED_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Every key/value of a nodeSelector is among the node's labels."""
    return all(labels.get(key) == value for key, value in selector.items())


def _requirement_matches(req: inventory.Requirement, value: str | None) -> bool:
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, want = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def term_matches(term: inventory.NodeSelectorTerm, name: str, labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: all expressions and fields hold; an empty term matches nothing."""
    if not term.expressions and not term.fields:
        return False
    for req in term.expressions:
        if not _requirement_matches(req, labels.get(req.key)):
            return False
    for req in term.fields:
        if req.key != "metadata.name" or req.operator not in ("In", "NotIn"):
            return False
        if not _requirement_matches(req, name):
            return False
    return True


def pod_matches(node: inventory.NodeInfo, pod: inventory.PodDemand) -> bool:
    """The pod's nodeSelector and its required node affinity (terms ORed)."""
    if pod.node_selector and not selector_matches(node.labels, pod.node_selector):
        return False
    if pod.required_terms:
        return any(term_matches(t, node.name, node.labels) for t in pod.required_terms)
    return True


def devices_failure(
    node: inventory.NodeInfo, free: Mapping[str, Sequence[str]], resources: Mapping[str, int]
) -> str | None:
    """The first requested resource (by name) the node has too few free devices of.

    A node whose inventory could not be read (``problems``) offers nothing at all: guessing at
    half of it could hand out the wrong devices.
    """
    if node.problems:
        return reasons.INVALID_INVENTORY
    for resource in sorted(resources):
        if len(free.get(resource, ())) < resources[resource]:
            return reasons.insufficient(resource)
    return None


def admission_failure(
    node: inventory.NodeInfo, pod: inventory.PodDemand, cpu_used: int, memory_used: int
) -> str | None:
    """What any pod must pass to run on the node: ready, taints, affinity, cpu and memory.

    Cordon (``spec.unschedulable``) and shared mode are deliberately not here: they stop *new
    groups*, not a pod joining a group already bound to the node.
    """
    if not node.ready:
        return reasons.NOT_READY
    taint = untolerated(node.taints, pod.tolerations)
    if taint is not None:
        return reasons.untolerated_taint(taint.key, taint.value)
    if not pod_matches(node, pod):
        return reasons.NODE_AFFINITY
    return resources_failure(node, pod, cpu_used, memory_used)


def resources_failure(
    node: inventory.NodeInfo, pod: inventory.PodDemand, cpu_used: int, memory_used: int
) -> str | None:
    if pod.cpu_milli > node.cpu_milli - cpu_used:
        return reasons.INSUFFICIENT_CPU
    if pod.memory_bytes > node.memory_bytes - memory_used:
        return reasons.INSUFFICIENT_MEMORY
    return None


def first_failure(
    node: inventory.NodeInfo,
    free: Mapping[str, Sequence[str]],
    cpu_used: int,
    memory_used: int,
    resources: Mapping[str, int],
    group_selector: Mapping[str, str],
    pod: inventory.PodDemand,
    devices_check: Callable[[], str | None] | None = None,
) -> str | None:
    """Why a new group (first pod ``pod``) cannot go to ``node``; None if it can.

    ``devices_check`` replaces the whole-device count check (sharing groups measure capacity).
    """
    if not node.shared:
        return reasons.NOT_SHARED
    if not node.ready:
        return reasons.NOT_READY
    if node.unschedulable:
        return reasons.UNSCHEDULABLE
    taint = untolerated(node.taints, pod.tolerations)
    if taint is not None:
        return reasons.untolerated_taint(taint.key, taint.value)
    if not pod_matches(node, pod):
        return reasons.NODE_AFFINITY
    if group_selector and not selector_matches(node.labels, group_selector):
        return reasons.GROUP_SELECTOR
    failure = devices_failure(node, free, resources) if devices_check is None else devices_check()
    if failure is not None:
        return failure
    return resources_failure(node, pod, cpu_used, memory_used)


def passes(
    node: inventory.NodeInfo,
    free: Mapping[str, Sequence[str]],
    cpu_used: int,
    memory_used: int,
    resources: Mapping[str, int],
    group_selector: Mapping[str, str],
    pod: inventory.PodDemand,
) -> bool:
    """``first_failure(...) is None``, cheapest checks first: the placement walk's hot path.

    On a busy cluster the nodes a walk skips are mostly out of cpu or memory, so those go first;
    no reason text is built.
    """
    if pod.cpu_milli > node.cpu_milli - cpu_used or pod.memory_bytes > node.memory_bytes - memory_used:
        return False
    for resource, need in resources.items():
        if len(free.get(resource, ())) < need:
            return False
    if not (node.shared and node.ready) or node.unschedulable or node.problems:
        return False
    if group_selector and not selector_matches(node.labels, group_selector):
        return False
    if (pod.node_selector or pod.required_terms) and not pod_matches(node, pod):
        return False
    return not node.taints or untolerated(node.taints, pod.tolerations) is None
