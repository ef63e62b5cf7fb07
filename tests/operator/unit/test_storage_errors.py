"""storage.ClusterApi: the requests it sends, the errors by intent it raises, and how it resolves lost answers.

The HTTP layer (``rest.call``) is replaced by a script that records every request (method, path with its query,
body, content type) and answers from a list, so each test says exactly what went over the wire.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from deviceshare.api import names
from deviceshare.kube import http1, rest
from deviceshare.operator import state, storage

GROUP = {
    "metadata": {"namespace": "ns", "name": "g", "uid": "u", "resourceVersion": "7", "generation": 2,
                 "finalizers": [names.GROUP_FINALIZER]},
    "spec": {"resources": {"nvidia.com/gpu": 1}},
    "status": {"phase": "Bound", "nodeName": "n1", "allocatedDevices": {"nvidia.com/gpu": ["0"]}},
}
GROUP_PATH = "/apis/deviceshare.io/v1alpha1/namespaces/ns/shareddevicegroups/g"
POD_PATH = "/api/v1/namespaces/ns/pods/p"
BOUND = {"phase": "Bound", "nodeName": "n1", "allocatedDevices": {"nvidia.com/gpu": ["0"]}}
NAMED = {"name": "g"}  # an object's 404 names it (kube-apiserver's NewNotFound)
ANNOTATIONS = {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}'}


@dataclass
class Sent:
    method: str
    path: str  # with the query
    body: Any
    content_type: str


class Script:
    """Answers requests in order; an answer may be a body, an exception to raise, or a function of the request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *answers: Any) -> None:
        self.answers = list(answers)
        self.sent: list[Sent] = []
        self.outcomes: list[tuple[str, str, str]] = []
        monkeypatch.setattr(rest, "call", self._call)
        self.api = storage.ClusterApi(api_client=None)  # type: ignore[arg-type]  # rest.call is replaced
        self.api.on_write = lambda verb, resource, result: self.outcomes.append((verb, resource, result))

    async def _call(self, client: Any, method: str, path: str, body: Any = None, *, content_type: str = "",
                    timeout: float | None = None, connections: Any = None, send_window: Any = None,
                    raw: bool = False) -> Any:
        if send_window is not None:  # as http1 does, once connected
            window = send_window()
            if window is None:
                raise http1.FenceClosed("the fence closed while connecting")
            path += f"{'&' if '?' in path else '?'}timeout={int(window * 1000)}ms"
        self.sent.append(Sent(method, path, copy.deepcopy(body), content_type))
        assert self.answers, f"unexpected request {method} {path}"
        answer = self.answers.pop(0)
        if callable(answer):
            answer = answer(self.sent[-1])
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, bytes):  # a body as the server sent it, whatever it is
            return answer
        return orjson.dumps(answer) if raw else copy.deepcopy(answer)

    def requests(self) -> list[tuple[str, str]]:
        """(method, path without query) of each request sent."""
        return [(s.method, s.path.split("?")[0]) for s in self.sent]


def group_with(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(GROUP)
    for key, value in changes.items():
        if key == "resourceVersion":
            body["metadata"]["resourceVersion"] = value
        else:
            body[key] = value
    return body


def pod(node: str | None = None, annotations: dict[str, str] | None = None, uid: str = "pu") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p", "uid": uid, "annotations": dict(annotations or {})},
            "spec": {"nodeName": node} if node else {}}


@pytest.mark.parametrize(
    ("failure", "error", "delay"),
    [
        pytest.param(rest.ApiError(409, "conflict"), storage.Conflict, None, id="409"),
        pytest.param(rest.ApiError(404, "not found", details=NAMED), storage.Gone, None, id="404"),
        # A 404 that names no object is about the path: the type is not served (a CRD not established yet).
        pytest.param(rest.ApiError(404, "the server could not find the requested resource", details={}),
                     storage.RetryLater, 1.0, id="404 of the type"),
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
async def test_read_failures_become_errors_by_intent(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, error: type[Exception], delay: float | None
) -> None:
    script = Script(monkeypatch, failure)
    with pytest.raises(error) as raised:
        await script.api.read_group(("ns", "g"))
    assert "get shareddevicegroup ns/g" in str(raised.value)  # says which request failed
    assert not isinstance(raised.value, storage.Uncertain)  # a read changes nothing: never uncertain
    if delay is not None:
        assert isinstance(raised.value, storage.RetryLater) and raised.value.delay == delay
    assert script.requests() == [("GET", GROUP_PATH)]


async def test_a_status_write_is_a_conditional_merge_patch_bounded_by_a_server_side_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script(monkeypatch, GROUP)
    record = await script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6")
    assert record == state.group_record(GROUP)
    (sent,) = script.sent
    path, _, query = sent.path.partition("?")
    assert (sent.method, path, sent.content_type) == ("PATCH", GROUP_PATH + "/status", storage.MERGE_PATCH)
    assert sent.body == {"status": BOUND, "metadata": {"resourceVersion": "6"}}  # the precondition
    assert query == "timeout=30000ms"  # a single replica's writes get the request timeout
    assert script.outcomes == [("patch", "shareddevicegroups/status", "ok")]


async def test_a_finalizer_write_replaces_the_list_conditionally(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(monkeypatch, GROUP)
    await script.api.set_group_finalizers(("ns", "g"), [names.GROUP_FINALIZER], uid="u", resource_version="6")
    (sent,) = script.sent
    assert (sent.method, sent.path.split("?")[0], sent.content_type) == ("PATCH", GROUP_PATH, storage.MERGE_PATCH)
    assert sent.body == {"metadata": {"finalizers": [names.GROUP_FINALIZER], "resourceVersion": "6"}}


@pytest.mark.parametrize(
    ("lost", "read_back", "then", "expect"),
    [
        # The answer was lost, but the group shows what we wrote: it landed.
        pytest.param(rest.ApiError(504, "Timeout"), group_with(status=BOUND, resourceVersion="8"), [], "landed",
                     id="504, landed"),
        pytest.param(aiohttp.ServerDisconnectedError(), group_with(status=BOUND, resourceVersion="8"), [],
                     "landed", id="dropped, landed"),
        # Still at the version it was conditional on: it did not land, and sending it again is safe.
        pytest.param(rest.ApiError(504, "Timeout"), group_with(status={}, resourceVersion="6"),
                     [group_with(status=BOUND, resourceVersion="9")], "resent", id="504, not landed, sent again"),
        # Someone else wrote in between: decide again.
        pytest.param(rest.ApiError(503, "unavailable"), group_with(status={"phase": "Pending"}, resourceVersion="8"),
                     [], storage.Conflict, id="503, overtaken"),
        pytest.param(rest.ApiError(504, "Timeout"), rest.ApiError(404, "gone", details=NAMED), [], storage.Gone,
                     id="504, gone"),
    ],
)
async def test_a_lost_status_answer_is_resolved_by_reading_the_group_back(
    monkeypatch: pytest.MonkeyPatch, lost: Exception, read_back: Any, then: list[Any], expect: Any
) -> None:
    script = Script(monkeypatch, lost, read_back, *then)
    if isinstance(expect, type):
        with pytest.raises(expect):
            await script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6")
    else:
        record = await script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6")
        assert record.status.phase == "Bound"
    expected = [("PATCH", GROUP_PATH + "/status"), ("GET", GROUP_PATH)]
    if expect == "resent":
        expected.append(("PATCH", GROUP_PATH + "/status"))
        assert script.sent[2].body == script.sent[0].body  # the same conditional write, nothing recomputed
    assert script.requests() == expected
    assert ("patch", "shareddevicegroups/status", "uncertain_resolved") in script.outcomes


@pytest.mark.looptime
async def test_a_lost_answer_that_cannot_be_read_back_stays_uncertain(monkeypatch: pytest.MonkeyPatch) -> None:
    down = aiohttp.ClientConnectorError(None, OSError(111, "refused"))  # type: ignore[arg-type]
    script = Script(monkeypatch, rest.ApiError(504, "Timeout"), down, down, down)
    with pytest.raises(storage.Uncertain):
        await script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6")
    assert script.outcomes == [("patch", "shareddevicegroups/status", "failed")]


@pytest.mark.parametrize(
    ("answer", "read_back", "expect"),
    [
        pytest.param(rest.ApiError(504, "Timeout"), pod("n1", ANNOTATIONS), None, id="504, bound by us"),
        pytest.param(aiohttp.ServerDisconnectedError(), pod("n1", ANNOTATIONS), None, id="dropped, bound by us"),
        # 409 "already assigned": our own earlier Binding that landed.
        pytest.param(rest.ApiError(409, "pod p is already assigned to node n1"), pod("n1", ANNOTATIONS), None,
                     id="409 from our own binding"),
        pytest.param(rest.ApiError(409, "pod p is already assigned to node n2"), pod("n2", {}), storage.Conflict,
                     id="409, bound by someone else"),
        pytest.param(rest.ApiError(504, "Timeout"), pod("n1", {}), storage.Conflict,
                     id="504, bound here but not by our binding"),
        pytest.param(rest.ApiError(504, "Timeout"), pod(), storage.Uncertain, id="504, not bound yet"),
        pytest.param(rest.ApiError(504, "Timeout"), None, storage.Gone, id="504, pod gone"),
        pytest.param(rest.ApiError(504, "Timeout"), pod("n1", ANNOTATIONS, uid="other"), storage.Gone,
                     id="504, another pod under the name"),
    ],
)
async def test_a_binding_is_read_back_after_a_lost_answer_or_a_409(
    monkeypatch: pytest.MonkeyPatch, answer: Exception, read_back: Any, expect: type[Exception] | None
) -> None:
    script = Script(monkeypatch, answer, rest.ApiError(404, "gone", details=NAMED) if read_back is None else read_back)
    if expect is None:
        await script.api.bind_pod(("ns", "p"), "pu", "n1", ANNOTATIONS)
    else:
        with pytest.raises(expect):
            await script.api.bind_pod(("ns", "p"), "pu", "n1", ANNOTATIONS)
    assert script.requests() == [("POST", POD_PATH + "/binding"), ("GET", POD_PATH)]
    binding = script.sent[0].body
    assert binding["metadata"]["uid"] == "pu" and binding["metadata"]["annotations"] == ANNOTATIONS
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


@pytest.mark.parametrize("remaining", [None, 0.01])
async def test_a_fenced_replica_sends_no_write(monkeypatch: pytest.MonkeyPatch, remaining: float | None) -> None:
    class Closed:
        def remaining(self) -> float | None:
            return remaining

    script = Script(monkeypatch)  # any request would fail the test: none is scripted
    script.api.fence = Closed()
    writes: list[Callable[[], Any]] = [
        lambda: script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6"),
        lambda: script.api.set_group_finalizers(("ns", "g"), [], uid="u", resource_version="6"),
        lambda: script.api.bind_pod(("ns", "p"), "pu", "n1", ANNOTATIONS),
        lambda: script.api.annotate_pod(("ns", "p"), "pu", ANNOTATIONS),
        lambda: script.api.set_pod_scheduled_condition(("ns", "p"), status="False", reason="r", message="m"),
    ]
    for write in writes:
        with pytest.raises(storage.Fenced):
            await write()
    assert script.sent == []
    assert {result for _, _, result in script.outcomes} == {"fenced"}


async def test_a_leaders_write_carries_what_is_left_of_its_renew_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    class Leader:
        def remaining(self) -> float | None:
            return 4.25

    script = Script(monkeypatch, GROUP)
    script.api.fence = Leader()
    await script.api.patch_group_status(("ns", "g"), BOUND, uid="u", resource_version="6")
    assert script.sent[0].path.endswith("?timeout=4250ms")


async def test_group_reads_answer_with_the_parsed_record(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(monkeypatch, GROUP, GROUP)
    expected = state.group_record(GROUP)
    assert await script.api.read_group(("ns", "g")) == expected
    assert await script.api.read_group_if_exists(("ns", "g")) == expected
    assert script.requests() == [("GET", GROUP_PATH)] * 2


async def test_a_missing_group_reads_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = rest.ApiError(404, "not found", details=NAMED)
    script = Script(monkeypatch, gone, gone)
    assert await script.api.read_group_if_exists(("ns", "g")) is None
    with pytest.raises(storage.Gone):
        await script.api.read_group(("ns", "g"))


async def test_a_write_that_never_left_is_retried_and_one_whose_answer_was_lost_is_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube/http1's two errors: no connection (the Binding never left: nothing to resolve, try again later) and a
    connection lost after sending (it may have landed: read back)."""
    script = Script(monkeypatch, http1.NotSent("connection refused"))
    with pytest.raises(storage.RetryLater) as not_sent:
        await script.api.bind_pod(("ns", "p"), "pu", "n1", ANNOTATIONS)
    assert not isinstance(not_sent.value, storage.Uncertain)
    assert script.requests() == [("POST", POD_PATH + "/binding")]
    assert script.outcomes == [("bind", "pods/binding", "failed")]

    script = Script(monkeypatch, http1.AnswerLost("dropped mid-answer"), pod("n1", ANNOTATIONS))
    await script.api.bind_pod(("ns", "p"), "pu", "n1", ANNOTATIONS)  # read back: bound by us
    assert script.requests() == [("POST", POD_PATH + "/binding"), ("GET", POD_PATH)]
    assert script.outcomes == [("bind", "pods/binding", "uncertain_resolved")]


async def test_a_list_goes_page_by_page_each_made_into_records_and_starts_again_after_a_410(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def page(names_: list[str], version: str, token: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": version, **({"continue": token} if token else {})}
        return {"metadata": meta, "items": [{"metadata": {"name": n}} for n in names_]}

    script = Script(monkeypatch, page(["a", "b"], "7", "t1"), rest.ApiError(410, "continue token too old"),
                    page(["a", "b"], "9", "t2"), page(["c"], "9", None))
    listing = await script.api.list_pods(lambda body: body["metadata"]["name"].upper())
    assert (listing.items, listing.resource_version) == (["A", "B", "C"], "9")
    paths = [s.path for s in script.sent]
    assert paths[0] == "/api/v1/pods?limit=2000" and paths[1].endswith("&continue=t1")
    assert paths[2] == paths[0] and paths[3].endswith("&continue=t2")  # a fresh list after the 410


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html><body>502 Bad Gateway</body></html>", id="a proxy's page"),
        pytest.param(b'{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"a"}},{"meta',
                     id="cut mid-item"),
        pytest.param(b'{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"a"}} 7]}',
                     id="items not separated"),
    ],
)
async def test_a_list_body_that_is_not_a_list_is_retried_later_never_half_taken(
    monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    script = Script(monkeypatch, body)
    with pytest.raises(storage.RetryLater, match="list pods: the server's answer is not a list") as caught:
        await script.api.list_pods(lambda item: item["metadata"]["name"])
    assert caught.value.delay == 1.0
    assert [s.path for s in script.sent] == ["/api/v1/pods?limit=2000"]


async def test_an_error_of_the_callers_own_transform_is_not_taken_for_a_bad_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Script(monkeypatch, {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "a"}}]})

    def transform(item: dict[str, Any]) -> int:
        return int(item["metadata"]["name"])  # a bug of ours: ValueError, which no retry would cure

    with pytest.raises(ValueError, match="invalid literal"):
        await script.api.list_pods(transform)
