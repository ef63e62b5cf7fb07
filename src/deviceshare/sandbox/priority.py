"""PriorityClasses and the Priority admission plugin, as kube-apiserver has them (scheduling.k8s.io/v1).

- The two system classes exist from the start (the API server's bootstrap creates them):
  ``system-node-critical`` (2000001000) and ``system-cluster-critical`` (2000000000).
- A PriorityClass is validated as its registry strategy does: a name with the ``system-`` prefix must
  be one of those two with their value, another may not exceed 1000000000, ``preemptionPolicy`` is
  ``PreemptLowerPriority`` (the default) or ``Never``, and ``value`` and ``preemptionPolicy`` never
  change. Admission refuses a second ``globalDefault`` class (403).
- A pod at CREATE gets ``spec.priority`` and ``spec.preemptionPolicy`` from its ``priorityClassName``,
  or from the global default class (whose name it then also gets), or 0 and ``PreemptLowerPriority``;
  an unknown class, or a ``spec.priority``/``preemptionPolicy`` the pod set that disagrees with the
  class, is refused with the plugin's own words (403 Forbidden).

Sources read: plugin/pkg/admission/priority/admission.go, pkg/apis/scheduling/validation, and the
scheduling storage's bootstrap of the system classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import errors, store

GROUP, PLURAL = "scheduling.k8s.io", "priorityclasses"
KEY = (GROUP, PLURAL)
HIGHEST_USER_DEFINABLE = 1_000_000_000
SYSTEM_CRITICAL = 2 * HIGHEST_USER_DEFINABLE
PREEMPT_LOWER, NEVER = "PreemptLowerPriority", "Never"
POLICIES = (NEVER, PREEMPT_LOWER)
SYSTEM_CLASSES = {
    "system-node-critical": (
        SYSTEM_CRITICAL + 1000, "Used for system critical pods that must not be moved from their current node."
    ),
    "system-cluster-critical": (
        SYSTEM_CRITICAL,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
}


def system_classes() -> list[dict[str, Any]]:
    """The two classes every cluster has, as the API server creates them at start."""
    return [
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": description,
            "preemptionPolicy": PREEMPT_LOWER,
        }
        for name, (value, description) in SYSTEM_CLASSES.items()
    ]


def prepare(obj: dict[str, Any]) -> None:
    """Defaults of a new or replaced PriorityClass (SetDefaults_PriorityClass)."""
    obj.setdefault("preemptionPolicy", PREEMPT_LOWER)
    obj.setdefault("value", 0)


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """ValidatePriorityClass / ValidatePriorityClassUpdate: (field, message) causes, empty when valid."""
    causes: list[tuple[str, str]] = []
    name = store.meta(obj).get("name", "")
    value = obj.get("value", 0)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value < 2**31:
        return [("value", f"Invalid value: {value!r}: must be a 32-bit integer")]
    if name.startswith("system-"):
        known = SYSTEM_CLASSES.get(name)
        if known is None:
            problem = f"{name} is not a known system priority class"
        elif value != known[0]:
            problem = f"value of {name} PriorityClass must be {known[0]}"
        elif obj.get("globalDefault", False):
            problem = f"globalDefault of {name} PriorityClass must be false"
        else:
            problem = ""
        if problem:
            causes.append(("metadata.name", "Forbidden: priority class names with 'system-' prefix are reserved "
                                            f"for system use only. error: {problem}"))
    elif value > HIGHEST_USER_DEFINABLE:
        causes.append(
            ("value", f"Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE}")
        )
    policy = obj.get("preemptionPolicy", PREEMPT_LOWER)
    if policy not in POLICIES:
        supported = ", ".join(f'"{p}"' for p in POLICIES)
        causes.append(("preemptionPolicy", f'Unsupported value: "{policy}": supported values: {supported}'))
    if old is not None:
        if old.get("value", 0) != value:
            causes.append(("value", "Forbidden: may not be changed in an update."))
        if old.get("preemptionPolicy", PREEMPT_LOWER) != policy:
            causes.append(("preemptionPolicy", "Invalid value: " f'"{policy}": field is immutable'))
    return causes


def _classes(objects: store.ObjectStore) -> list[dict[str, Any]]:
    items, _ = objects.list_objects(objects.catalog.lookup(PLURAL), copied=False)
    return items


def default_class(objects: store.ObjectStore) -> Mapping[str, Any] | None:
    """The global default class; among several (a race), the one of lowest value, as the plugin picks."""
    defaults = [c for c in _classes(objects) if c.get("globalDefault")]
    return min(defaults, key=lambda c: c.get("value", 0)) if defaults else None


def check_class(objects: store.ObjectStore, operation: str, obj: Mapping[str, Any]) -> None:
    """Validating admission of a PriorityClass write: at most one ``globalDefault``."""
    if not obj.get("globalDefault"):
        return
    name = store.meta(obj).get("name", "")
    found = default_class(objects)
    if found is not None and (operation == "CREATE" or store.meta(found).get("name") != name):
        raise errors.forbidden(
            PLURAL, GROUP, name,
            f"PriorityClass {store.meta(found).get('name')} is already marked as default. Only one default can exist",
        )


def admit_pod(objects: store.ObjectStore, pod: dict[str, Any]) -> dict[str, Any]:
    """The Priority plugin at pod CREATE: ``spec.priority`` and ``spec.preemptionPolicy`` from the class."""
    spec = pod.setdefault("spec", {})
    name = store.meta(pod).get("name") or store.meta(pod).get("generateName", "")
    class_name = spec.get("priorityClassName") or ""
    if class_name:
        found: Mapping[str, Any] | None = next(
            (c for c in _classes(objects) if store.meta(c).get("name") == class_name), None
        )
        if found is None:
            raise errors.forbidden("pods", "", name, f"no PriorityClass with name {class_name} was found")
    else:
        found = default_class(objects)
        if found is not None:
            spec["priorityClassName"] = store.meta(found).get("name")
    value = int(found.get("value", 0)) if found is not None else 0
    policy = str(found.get("preemptionPolicy", PREEMPT_LOWER)) if found is not None else PREEMPT_LOWER
    given = spec.get("priority")
    if given is not None and given != value:
        raise errors.forbidden(
            "pods", "", name,
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {value} from the given PriorityClass name",
        )
    given_policy = spec.get("preemptionPolicy")
    if given_policy is not None and given_policy != policy:
        raise errors.forbidden(
            "pods", "", name,
            f"the string value of PreemptionPolicy ({given_policy}) must not be provided in pod spec; "
            f"priority admission controller computed {policy} from the given PriorityClass name",
        )
    spec["priority"], spec["preemptionPolicy"] = value, policy
    return pod
