"""The admission decision, without HTTP: golden patches, every denial, idempotency, the review envelope."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.api import envnames, models, names
from deviceshare.webhooks import admission

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.yaml"))
NS = "ml"


@dataclass
class Groups:
    """An in-memory GroupView."""

    specs: dict[tuple[str, str], models.GroupSpec] = field(default_factory=dict)
    members: dict[tuple[str, str], int] = field(default_factory=dict)
    warming: bool = False
    deleting: set[tuple[str, str]] = field(default_factory=set)

    def group(self, namespace: str, name: str) -> models.GroupSpec | admission.Unjoinable | None:
        if self.warming:
            return admission.WARMING
        return admission.DELETING if (namespace, name) in self.deleting else self.specs.get((namespace, name))

    def member_count(self, namespace: str, name: str) -> int:
        return self.members.get((namespace, name), 0)


def make_review(
    pod: Mapping[str, Any], *, operation: str = "CREATE", uid: str = "uid-1", **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS,
            "operation": operation,
            "object": pod,
            **extra,
        },
    }


def pod(
    group: str | None = "trainer", containers: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if group is not None:
        meta["annotations"] = {names.POD_GROUP_ANNOTATION: group}
    return {"metadata": meta, "spec": {"containers": containers or [{"name": "main", "image": "x"}], **spec}}


def groups(**specs: dict[str, Any]) -> Groups:
    return Groups({(NS, n): models.GroupSpec.model_validate(s) for n, s in specs.items()})


def patch_of(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(body["patch"])))


def run(review: Mapping[str, Any], view: Groups, env: envnames.EnvNames | None = None) -> dict[str, Any]:
    return admission.review(review, view, env or envnames.EnvNames(), names.DEFAULT_SCHEDULER_NAME)


@pytest.mark.parametrize("case", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_patch(case: Path) -> None:
    data = yaml.safe_load(case.read_text())
    view = groups(**{data["pod"]["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]: data["group"]})
    env = envnames.EnvNames(data.get("envNames"))
    response = run(make_review(data["pod"]), view, env)
    assert response["response"]["allowed"] is True
    assert patch_of(response) == data["patch"]
    # The patched pod is what a reinvocation sees: it must need nothing more.
    patched = jsonpatch.apply_patch(data["pod"], patch_of(response))
    assert patch_of(run(make_review(patched), view, env)) == []
    assert "patch" not in run(make_review(patched), view, env)["response"]


TRAINER = {"resources": {"nvidia.com/gpu": 2}}
INJECTED = admission.env_entry("NVIDIA_VISIBLE_DEVICES")

DENIALS = [
    ("unknown group", pod("nope"), "SharedDeviceGroup 'nope' does not exist in namespace 'ml'"),
    ("empty group name", pod(""), "deviceshare.io/device-group is empty"),
    ("blank group name", pod("  "), "deviceshare.io/device-group is empty"),
    ("malformed group name", pod("Trainer_1"), "'Trainer_1' is not a valid group name"),
    ("group name too long", pod("a" * 64), "is not a valid group name"),
    ("nodeName set", pod(nodeName="gpu-1"), "already sets spec.nodeName='gpu-1'"),
    (
        "container limits the device",
        pod(containers=[{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]),
        "container 'main' requests nvidia.com/gpu in resources.limits",
    ),
    (
        "init container requests the device",
        pod(
            initContainers=[{"name": "init", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        ),
        "init container 'init' requests nvidia.com/gpu in resources.requests",
    ),
    (
        "container sets the visibility var itself",
        pod(containers=[{"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]),
        "container 'main' sets env var NVIDIA_VISIBLE_DEVICES itself",
    ),
    (
        "container reads the var from another field",
        pod(
            containers=[
                {
                    "name": "main",
                    "env": [
                        {
                            "name": "NVIDIA_VISIBLE_DEVICES",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['other']"}},
                        }
                    ],
                }
            ]
        ),
        "sets env var NVIDIA_VISIBLE_DEVICES itself",
    ),
]


@pytest.mark.parametrize(("pod_body", "message"), [d[1:] for d in DENIALS], ids=[d[0] for d in DENIALS])
def test_denials_name_the_problem(pod_body: dict[str, Any], message: str) -> None:
    response = run(make_review(pod_body, uid="u-42"), groups(trainer=TRAINER))["response"]
    assert response["uid"] == "u-42"
    assert response["allowed"] is False
    assert message in response["status"]["message"]
    assert response["status"]["code"] == 403
    assert "patch" not in response


def test_other_resources_and_other_vars_are_allowed() -> None:
    container = {
        "name": "main",
        "resources": {"limits": {"cpu": "2", "amd.com/gpu": 1}},
        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}, INJECTED],
    }
    response = run(make_review(pod(containers=[container])), groups(trainer=TRAINER))
    assert response["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("max_members", "members", "allowed"), [(2, 0, True), (2, 1, True), (2, 2, False), (0, 99, True)]
)
def test_max_members_counts_the_new_pod(max_members: int, members: int, allowed: bool) -> None:
    view = groups(trainer={**TRAINER, "maxMembers": max_members})
    view.members[(NS, "trainer")] = members
    response = run(make_review(pod()), view)["response"]
    assert response["allowed"] is allowed
    if not allowed:
        assert f"already has {members} of its maxMembers={max_members}" in response["status"]["message"]


def test_group_being_deleted_takes_no_new_members() -> None:
    view = groups(trainer=TRAINER)
    view.deleting.add((NS, "trainer"))
    response = run(make_review(pod()), view)["response"]
    assert response["allowed"] is False
    assert "'trainer' is being deleted" in response["status"]["message"]


def test_group_in_another_namespace_is_not_found() -> None:
    view = Groups({("other", "trainer"): models.GroupSpec.model_validate(TRAINER)})
    response = run(make_review(pod()), view)["response"]
    assert response["allowed"] is False
    assert "does not exist in namespace 'ml'" in response["status"]["message"]


def test_namespace_falls_back_to_the_pod_metadata() -> None:
    body = pod()
    body["metadata"]["namespace"] = "other"
    review = make_review(body)
    del review["request"]["namespace"]
    view = Groups({("other", "trainer"): models.GroupSpec.model_validate(TRAINER)})
    assert run(review, view)["response"]["allowed"] is True


def test_warming_cache_denies_with_a_retry_message() -> None:
    response = run(make_review(pod()), Groups(warming=True))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == admission.RETRY_MESSAGE
    assert response["status"]["code"] == 503


@pytest.mark.parametrize(
    "review",
    [
        make_review(pod(None)),
        make_review({"metadata": {"name": "p", "annotations": {"other": "x"}}, "spec": {"containers": []}}),
        make_review(pod(), operation="UPDATE"),
        make_review(pod(), subResource="status"),
        {
            **make_review(pod()),
            "request": {**make_review(pod())["request"], "kind": {"group": "apps", "kind": "Pod"}},
        },
    ],
    ids=["no annotation", "other annotations", "update", "subresource", "other api group"],
)
def test_untouched(review: dict[str, Any]) -> None:
    before = copy.deepcopy(review)
    response = run(review, groups(trainer=TRAINER))
    assert response["response"] == {"uid": "uid-1", "allowed": True}
    assert review == before


def test_dry_run_gets_the_same_answer() -> None:
    view = groups(trainer=TRAINER)
    assert run(make_review(pod(), dryRun=True), view) == run(make_review(pod(), dryRun=False), view)


def test_envelope_echoes_uid_and_version() -> None:
    response = run(make_review(pod(), uid="abc"), groups(trainer=TRAINER))
    assert response["apiVersion"] == "admission.k8s.io/v1"
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "abc"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"kind": "Pod"},
        {"kind": "AdmissionReview"},
        {"kind": "AdmissionReview", "request": {"operation": "CREATE"}},
    ],
)
def test_malformed_reviews_raise(body: dict[str, Any]) -> None:
    with pytest.raises(admission.MalformedReview):
        run(body, groups())


def test_pointer_escapes_rfc6901() -> None:
    assert admission.pointer("metadata", "labels", "a/b~c") == "/metadata/labels/a~1b~0c"
    assert admission.pointer("spec", "containers", 3, "env", "-") == "/spec/containers/3/env/-"


# -- properties ---------------------------------------------------------------------------------

env_var = st.sampled_from(["PATH", "HOME", "NVIDIA_VISIBLE_DEVICES", "AMD_VISIBLE_DEVICES", "X"])
containers = st.lists(
    st.builds(
        lambda i, env: {"name": f"c{i}", **({"env": env} if env is not None else {})},
        st.integers(0, 9),
        st.none()
        | st.lists(
            env_var.map(
                lambda n: admission.env_entry(n) if n.endswith("DEVICES") else {"name": n, "value": "v"}
            ),
            unique_by=lambda e: e["name"],
            max_size=3,
        ),
    ),
    max_size=3,
)
resources = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "example.com/fpga", "habana.ai/gaudi"]),
    st.integers(1, 4),
    min_size=1,
)


@settings(max_examples=150, deadline=None)
@given(
    init=containers,
    main=containers.filter(bool),
    res=resources,
    labels=st.none()
    | st.dictionaries(st.sampled_from(["app", names.POD_GROUP_LABEL]), st.sampled_from(["g", "x"])),
    scheduler=st.none() | st.sampled_from(["default-scheduler", names.DEFAULT_SCHEDULER_NAME]),
)
def test_patch_applies_and_is_idempotent(
    init: list[dict[str, Any]],
    main: list[dict[str, Any]],
    res: dict[str, int],
    labels: dict[str, str] | None,
    scheduler: str | None,
) -> None:
    body = pod("g", containers=main, **({"initContainers": init} if init else {}))
    if labels is not None:
        body["metadata"]["labels"] = labels
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    view = groups(g={"resources": res})
    env = envnames.EnvNames()
    wanted = admission.visibility_env(view.specs[(NS, "g")], env)

    decision = admission.decide(make_review(body), view, env)
    assert decision.allowed
    patched = jsonpatch.apply_patch(body, decision.patch)
    assert patched["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME
    assert patched["metadata"]["labels"][names.POD_GROUP_LABEL] == "g"
    for c in [*patched["spec"].get("initContainers", []), *patched["spec"]["containers"]]:
        entries = [e for e in c["env"] if e["name"] in wanted]
        assert sorted(e["name"] for e in entries) == sorted(wanted)  # each exactly once
        assert all(admission.is_injected(e) for e in entries)
    # Others' env entries and labels survive untouched, in order.
    for before, after in zip(body["spec"]["containers"], patched["spec"]["containers"], strict=True):
        assert after["env"][: len(before.get("env") or [])] == (before.get("env") or [])
    again = admission.decide(make_review(patched), view, env)
    assert again.allowed and again.patch == [] and again.outcome == "unchanged"


SHARING = {"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"compute": "250m", "memory": "4Gi"}}}


def test_a_sharing_group_gets_its_limit_vars_wired_and_may_not_set_them() -> None:
    response = run(make_review(pod("notebook")), groups(notebook=SHARING))["response"]
    wired = [op["value"] for op in patch_of({"response": response}) if op["path"].endswith("/env")]
    assert [e["name"] for e in wired[0]] == [
        "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ]
    assert wired[0][1] == admission.env_entry("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    sets_it = pod("notebook", containers=[{"name": "main", "env": [
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}]}])
    denied = run(make_review(sets_it), groups(notebook=SHARING))["response"]
    assert denied["allowed"] is False
    assert "container 'main' sets env var CUDA_MPS_PINNED_DEVICE_MEM_LIMIT itself" in denied["status"]["message"]
