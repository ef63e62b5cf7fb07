"""Render the install manifests and check objects against the schemas the API server would use.

Shared by the manifest tests (and importable by other suites as ``tests.manifests.kube_objects``):
rendering goes through the real ``kubectl kustomize`` so what is tested is what users apply.
Core kinds are checked by ``kubernetes_validate`` against the published Kubernetes schemas;
custom resources against the ``openAPIV3Schema`` of the CRD that serves them.
"""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

# The Kubernetes release whose schemas the manifests must satisfy (the oldest we support:
# matchConditions on admission webhooks are GA since 1.30).
KUBERNETES_VERSION = "1.32"

KubeObject = dict[str, Any]


class RenderError(RuntimeError):
    """kubectl could not render a kustomization."""


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(kustomization_dir: Path) -> list[KubeObject]:
    """What ``kubectl apply -k DIR`` would send, as a list of objects."""
    binary = kubectl()
    if binary is None:
        raise RenderError("kubectl is not installed")
    proc = subprocess.run(
        [binary, "kustomize", str(kustomization_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if proc.returncode != 0:
        raise RenderError(f"kubectl kustomize {kustomization_dir} failed: {proc.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def load_file(path: Path) -> list[KubeObject]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def ref(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` for messages."""
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


def group_of(obj: Mapping[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    return api_version.split("/")[0] if "/" in api_version else ""


def select(objects: Iterable[KubeObject], kind: str, name: str | None = None) -> list[KubeObject]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Iterable[KubeObject], kind: str, name: str) -> KubeObject:
    found = select(objects, kind, name)
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def crds_by_kind(objects: Iterable[KubeObject]) -> dict[tuple[str, str], KubeObject]:
    """(group, kind) -> CustomResourceDefinition."""
    return {(o["spec"]["group"], o["spec"]["names"]["kind"]): o
            for o in objects if o["kind"] == "CustomResourceDefinition"}


def is_core_kind(obj: Mapping[str, Any]) -> bool:
    """Served by Kubernetes itself (``kubernetes_validate`` has its schema), not by a CRD."""
    return _has_schema(str(obj["apiVersion"]), str(obj["kind"]))


@functools.cache
def _has_schema(api_version: str, kind: str) -> bool:
    try:
        kubernetes_validate.validate({"apiVersion": api_version, "kind": kind}, KUBERNETES_VERSION)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True


def validate_core(obj: KubeObject) -> None:
    """Strict: unknown fields fail too, as ``kubectl apply --validate=strict`` would."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def crd_json_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema for ``version`` as plain JSON Schema.

    Kubernetes' structural-schema extensions (``x-kubernetes-*``) have no JSON Schema meaning;
    ``x-kubernetes-preserve-unknown-fields`` is the default behaviour of JSON Schema anyway.
    ``metadata`` is checked by the API server, not the schema, so it is left open.
    """
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            return dict(_strip_extensions(schema))
    raise KeyError(f"{crd['metadata']['name']} serves no version {version}")


def _strip_extensions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_extensions(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if isinstance(node, list):
        return [_strip_extensions(v) for v in node]
    return node


def validate_custom(obj: KubeObject, crds: Mapping[tuple[str, str], KubeObject]) -> None:
    group, _, version = str(obj["apiVersion"]).partition("/")
    crd = crds.get((group, obj["kind"]))
    if crd is None:
        raise LookupError(f"no CRD for {obj['apiVersion']} {obj['kind']}")
    if crd["spec"]["scope"] == "Namespaced":
        assert obj["metadata"].get("namespace"), f"{ref(obj)}: namespaced kind without a namespace"
    else:
        assert "namespace" not in obj["metadata"], f"{ref(obj)}: cluster-scoped kind with a namespace"
    jsonschema.validate(obj, crd_json_schema(crd, version))


def pod_templates(objects: Iterable[KubeObject]) -> Iterator[tuple[KubeObject, KubeObject]]:
    """(owner, pod spec-with-metadata) for Pods and the templates of workload kinds."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield obj, obj
        elif obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
            yield obj, obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            yield obj, obj["spec"]["jobTemplate"]["spec"]["template"]


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against a label set."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
