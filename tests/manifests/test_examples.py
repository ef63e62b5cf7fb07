"""The examples are valid and do what their comments say when applied as they stand.

A user copies these first, so each must pass the API server (core schemas, the CRD's schema),
join pods to groups that exist in the same namespace, and leave the rest to deviceshare: no
schedulerName, no device requests that would double-book the device plugin, no visibility env.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deviceshare.api import envnames, models, names
from tests.manifests import kube_objects

ROOT = Path(__file__).resolve().parents[2]
# examples/dra: DRA groups (CONTRACT §13), kept apart because they need a DRA driver (`deviceshare demo --dra`)
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "dra").glob("*.yaml"))
CRD = kube_objects.load_file(ROOT / "crds" / "shareddevicegroups.yaml")


def _objects(path: Path) -> list[kube_objects.KubeObject]:
    return kube_objects.load_file(path)


def test_the_promised_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "gpu-node.yaml", "trainer-evaluator.yaml", "shared-inference.yaml", "spread-group.yaml",
        "inference-sharing.yaml", "notebook-fleet.yaml", "intel-tiles.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_object_validates(path: Path) -> None:
    crds = kube_objects.crds_by_kind(CRD)
    for obj in _objects(path):
        if obj["kind"] == names.KIND:
            kube_objects.validate_custom(obj, crds)
            models.GroupSpec.model_validate(obj["spec"])
        else:
            kube_objects.validate_core(obj)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_pods_join_existing_groups_in_their_own_namespace(path: Path) -> None:
    objects = _objects(path)
    groups = {(g["metadata"]["namespace"], g["metadata"]["name"]): g
              for g in kube_objects.select(objects, names.KIND)}
    namespaces = {n["metadata"]["name"] for n in kube_objects.select(objects, "Namespace")}
    for group_ns, _ in groups:
        assert group_ns in namespaces, f"{path.name}: namespace {group_ns} is not created"
    for owner, template in kube_objects.pod_templates(objects):
        ns = owner["metadata"]["namespace"]
        group_name = template["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]
        group = groups[(ns, group_name)]
        spec = models.GroupSpec.model_validate(group["spec"])
        pod_spec = template["spec"]
        assert "schedulerName" not in pod_spec and "nodeName" not in pod_spec
        visibility = {e for r in spec.resources for e in envnames.EnvNames().for_resource(r)}
        for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
            requested = {*container.get("resources", {}).get("limits", {}),
                         *container.get("resources", {}).get("requests", {})}
            assert not requested & set(spec.resources), f"{kube_objects.ref(owner)} asks the device plugin"
            assert not {e["name"] for e in container.get("env", [])} & visibility


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_workloads_fit_their_groups_member_limit(path: Path) -> None:
    objects = _objects(path)
    members: dict[tuple[str, str], int] = {}
    for owner, template in kube_objects.pod_templates(objects):
        group_name = template["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]
        key = (owner["metadata"]["namespace"], group_name)
        count = 1
        if owner["kind"] == "Deployment":
            surge = owner["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxSurge", "25%")
            assert isinstance(surge, int), "an absolute maxSurge keeps rollouts within maxMembers"
            count = owner["spec"]["replicas"] + surge
        members[key] = members.get(key, 0) + count
    for group in kube_objects.select(objects, names.KIND):
        limit = models.GroupSpec.model_validate(group["spec"]).max_members
        used = members.get((group["metadata"]["namespace"], group["metadata"]["name"]), 0)
        assert limit == 0 or used <= limit, f"{kube_objects.ref(group)}: {used} pods > maxMembers {limit}"


def test_the_node_example_is_in_shared_mode() -> None:
    (node,) = _objects(ROOT / "examples" / "gpu-node.yaml")
    assert node["metadata"]["labels"][names.NODE_MODE_LABEL] == names.NODE_MODE_SHARED
    devices = json.loads(node["metadata"]["annotations"][names.NODE_DEVICES_ANNOTATION])
    assert all(isinstance(i, str) for ids in devices.values() for i in ids)


def test_the_spread_example_spreads_and_the_others_binpack() -> None:
    strategies = {p.name: {models.GroupSpec.model_validate(g["spec"]).scheduling_strategy
                           for g in kube_objects.select(_objects(p), names.KIND)} for p in EXAMPLES}
    assert strategies["spread-group.yaml"] == {"spread"}
    assert strategies["trainer-evaluator.yaml"] == {"binpack"}


def test_the_shared_inference_deployment_shares_one_gpu() -> None:
    objects = _objects(ROOT / "examples" / "shared-inference.yaml")
    (group,) = kube_objects.select(objects, names.KIND)
    (deployment,) = kube_objects.select(objects, "Deployment")
    assert group["spec"]["resources"] == {"nvidia.com/gpu": 1}
    assert deployment["spec"]["replicas"] == 3
    assert group["spec"]["maxMembers"] == 4
