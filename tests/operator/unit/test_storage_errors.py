"""storage.ClusterApi turns every API failure into an error by intent, once, and hands back parsed records."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import aiohttp
import pytest

from deviceshare.api import names
from deviceshare.kube import rest
from deviceshare.operator import state, storage

GROUP_PATH = f"/apis/{names.API_VERSION}/namespaces/ns/{names.PLURAL}/g"
GROUP = {
    "metadata": {"namespace": "ns", "name": "g", "uid": "u", "resourceVersion": "7", "generation": 2,
                 "finalizers": [names.GROUP_FINALIZER]},
    "spec": {"resources": {"nvidia.com/gpu": 1}},
    "status": {"phase": "Bound", "nodeName": "n1", "allocatedDevices": {"nvidia.com/gpu": ["0"]}},
}


@dataclasses.dataclass
class Sent:
    method: str
    path: str
    body: Any
    content_type: str


def api_answering(monkeypatch: pytest.MonkeyPatch, answer: Any, sent: list[Sent] | None = None) -> storage.ClusterApi:
    """A ClusterApi whose every request gets ``answer`` (raised if it is an exception); each request it
    sends is recorded in ``sent``, as the API server would receive it."""
    async def call(api: Any, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                   timeout: float | None = None) -> Any:
        if sent is not None:
            sent.append(Sent(method, path, copy.deepcopy(body), content_type))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(rest, "call", call)
    return storage.ClusterApi(api_client=None)  # type: ignore[arg-type]  # never reached: rest.call is replaced


@pytest.mark.parametrize(
    ("failure", "error", "delay"),
    [
        pytest.param(rest.ApiError(409, "conflict"), storage.Conflict, None, id="409"),
        pytest.param(rest.ApiError(404, "not found"), storage.Gone, None, id="404"),
        pytest.param(rest.ApiError(403, "forbidden"), storage.Invalid, None, id="403"),
        pytest.param(rest.ApiError(422, "invalid"), storage.Invalid, None, id="422"),
        pytest.param(rest.ApiError(429, "slow down", {"Retry-After": "7"}), storage.RetryLater, 7.0,
                     id="429 with Retry-After"),
        pytest.param(rest.ApiError(429, "slow down", {"Retry-After": "soon"}), storage.RetryLater, 1.0,
                     id="429 with an unreadable Retry-After"),
        pytest.param(rest.ApiError(500, "boom"), storage.RetryLater, 1.0, id="500"),
        pytest.param(aiohttp.ClientConnectionError("reset"), storage.RetryLater, 1.0, id="connection dropped"),
        pytest.param(TimeoutError(), storage.RetryLater, 1.0, id="timeout"),
    ],
)
async def test_failures_become_errors_by_intent(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, error: type[Exception], delay: float | None
) -> None:
    sent: list[Sent] = []
    api = api_answering(monkeypatch, failure, sent)
    with pytest.raises(error) as raised:
        await api.patch_group_status(("ns", "g"), {"phase": "Bound"}, resource_version="6")
    assert [(s.method, s.path) for s in sent] == [("PATCH", f"{GROUP_PATH}/status")]  # one try, the one asked
    assert "patch status of shareddevicegroup ns/g" in str(raised.value)  # says which request failed
    if delay is not None:
        assert isinstance(raised.value, storage.RetryLater) and raised.value.delay == delay


async def test_group_writes_and_reads_send_what_the_api_expects_and_answer_with_the_parsed_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[Sent] = []
    api = api_answering(monkeypatch, GROUP, sent)
    expected = state.group_record(GROUP)
    assert await api.patch_group_status(("ns", "g"), {"phase": "Bound"}, resource_version="6") == expected
    assert await api.set_group_finalizers(("ns", "g"), [names.GROUP_FINALIZER], resource_version="6") == expected
    assert await api.read_group(("ns", "g")) == expected
    assert await api.read_group_if_exists(("ns", "g")) == expected
    assert sent == [
        # Conditional on the resourceVersion the status was computed from: a stale one is a 409.
        Sent("PATCH", f"{GROUP_PATH}/status", {"status": {"phase": "Bound"}, "metadata": {"resourceVersion": "6"}},
             storage.MERGE_PATCH),
        # The whole finalizer list, conditional too, so no one else's entry written meanwhile is lost.
        Sent("PATCH", GROUP_PATH, {"metadata": {"finalizers": [names.GROUP_FINALIZER], "resourceVersion": "6"}},
             storage.MERGE_PATCH),
        Sent("GET", GROUP_PATH, None, "application/json"),
        Sent("GET", GROUP_PATH, None, "application/json"),
    ]


async def test_pod_writes_carry_their_preconditions_and_the_binding_its_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[Sent] = []
    api = api_answering(monkeypatch, {}, sent)
    devices = {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}'}
    await api.bind_pod(("ns", "p"), "uid-1", "node-a", devices)
    await api.annotate_pod(("ns", "p"), "uid-1", devices)
    await api.set_pod_scheduled_condition(("ns", "p"), status="False", reason="Unschedulable", message="no room")
    binding, annotation, condition = sent
    assert (binding.method, binding.path) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    assert binding.body == {
        "apiVersion": "v1", "kind": "Binding",
        # The uid is the precondition (a pod deleted and re-created under the name is not bound); the
        # devices travel in the same write.
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "annotations": devices},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    assert (annotation.method, annotation.path, annotation.content_type) == (
        "PATCH", "/api/v1/namespaces/ns/pods/p", storage.MERGE_PATCH)
    assert annotation.body == {"metadata": {"uid": "uid-1", "annotations": devices}}
    assert (condition.method, condition.path, condition.content_type) == (
        "PATCH", "/api/v1/namespaces/ns/pods/p/status", storage.STRATEGIC_MERGE_PATCH)
    (cond,) = condition.body["status"]["conditions"]
    assert {k: cond[k] for k in ("type", "status", "reason", "message")} == {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no room"}


async def test_names_are_one_path_segment_each(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Sent] = []
    api = api_answering(monkeypatch, GROUP, sent)
    await api.read_group(("ns", "../shareddevicegroups?watch=true"))
    assert sent[0].path.rsplit("/", 1)[1] == "..%2Fshareddevicegroups%3Fwatch%3Dtrue"
    with pytest.raises(storage.Invalid):
        await api.read_group(("ns", ".."))
    assert len(sent) == 1  # refused before anything was sent


async def test_a_missing_group_reads_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    api = api_answering(monkeypatch, rest.ApiError(404, "not found"))
    assert await api.read_group_if_exists(("ns", "g")) is None
    with pytest.raises(storage.Gone):
        await api.read_group(("ns", "g"))
