"""The resource types the sandbox serves: built-in kinds plus those CRDs add at run time.

Discovery, routing, field selectors, the status subresource and validation all read from here,
so a CRD applied to the sandbox becomes a served resource exactly as on a real cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    field_selectors: frozenset[str] = frozenset()
    schema: Mapping[str, Any] | None = None  # openAPIV3Schema, CRDs only
    printer_columns: tuple[Mapping[str, Any], ...] = ()
    custom: bool = False
    verbs: tuple[str, ...] = VERBS

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def selectable(self, field: str) -> bool:
        return field in COMMON_FIELDS or field in self.field_selectors


def _core(plural: str, kind: str, **kw: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind, **kw)


BUILTINS: tuple[ResourceType, ...] = (
    _core(
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status"}),
        field_selectors=frozenset({"status.phase"}),
    ),
    _core(
        "nodes",
        "Node",
        namespaced=False,
        short_names=("no",),
        subresources=frozenset({"status"}),
        field_selectors=frozenset({"spec.unschedulable"}),
    ),
    _core(
        "pods",
        "Pod",
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status", "binding", "ephemeralcontainers", "eviction"}),
        field_selectors=frozenset(
            {
                "spec.nodeName",
                "spec.schedulerName",
                "status.phase",
                "spec.serviceAccountName",
                "spec.restartPolicy",
                "status.podIP",
                "status.nominatedNodeName",
            }
        ),
    ),
    _core("bindings", "Binding", verbs=("create",)),
    _core("events", "Event", short_names=("ev",), field_selectors=EVENT_FIELDS),
    _core("configmaps", "ConfigMap", short_names=("cm",)),
    _core("secrets", "Secret", field_selectors=frozenset({"type"})),
    _core(
        "services", "Service", short_names=("svc",), categories=("all",), subresources=frozenset({"status"})
    ),
    _core("serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _core("endpoints", "Endpoints", short_names=("ep",)),
    _core("resourcequotas", "ResourceQuota", short_names=("quota",), subresources=frozenset({"status"})),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)),
    ResourceType(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        short_names=("ev",),
        field_selectors=frozenset(
            {
                "regarding.kind",
                "regarding.name",
                "regarding.namespace",
                "regarding.uid",
                "reason",
                "type",
                "reportingController",
            }
        ),
    ),
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
    ),
    ResourceType(
        "apps",
        "v1",
        "daemonsets",
        "DaemonSet",
        short_names=("ds",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        short_names=("sts",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        short_names=("rs",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    ResourceType("batch", "v1", "jobs", "Job", categories=("all",), subresources=frozenset({"status"})),
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short_names=("pdb",),
        subresources=frozenset({"status"}),
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType(
        "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False, short_names=("pc",)
    ),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=frozenset({"status"}),
    ),
    # Dynamic Resource Allocation (GA in Kubernetes 1.34); validation in dra.py, draslices.py, claims.py.
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False),
    ResourceType(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        field_selectors=frozenset({"spec.nodeName", "spec.driver"}),
    ),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", subresources=frozenset({"status"})),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        namespaced=False,
        subresources=frozenset({"status"}),
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        namespaced=False,
    ),
)


def from_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition, one ResourceType each."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    result = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                subresources=frozenset(version.get("subresources", {}) or {}),
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=tuple(version.get("additionalPrinterColumns", ())),
                custom=True,
            )
        )
    return result


class Catalog:
    """The served resource types, looked up by URL parts or by any of their names."""

    def __init__(self, types: Sequence[ResourceType] = BUILTINS) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in types:
            self.add(rtype)

    def copy(self) -> Catalog:
        """An independent copy (a dry-run write may serve a CRD that must not stay served)."""
        other = Catalog(())
        other._types = dict(self._types)
        return other

    def add(self, rtype: ResourceType) -> None:
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def remove_group_plural(self, group: str, plural: str) -> None:
        for key in [k for k in self._types if k[0] == group and k[2] == plural]:
            del self._types[key]

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def lookup(self, name: str) -> ResourceType:
        """By plural, singular, kind or short name, optionally qualified: ``sdg``, ``pods``, ``Pod``."""
        name_part, _, group = name.partition(".")
        for rtype in self._types.values():
            names = {rtype.plural, rtype.singular, rtype.kind.lower(), *rtype.short_names}
            if name_part.lower() in names and (not group or rtype.group == group):
                return rtype
        raise KeyError(name)

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))

    def groups(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for group, version, _ in self._types:
            if group and version not in result.setdefault(group, []):
                result[group].append(version)
        return result
