"""Malformed AdmissionReviews, over real HTTPS to the real server: each is a 400 naming the problem, none a 500.

A body that cannot be answered as a review (not JSON, no ``request.uid``) gets HTTP 400 with a
``Status``; a review with a uid whose content has wrong types gets an AdmissionReview denial with
``status.code`` 400 (why the two differ: docs/security.md, "Malformed reviews"). The table covers
wrong types at every level of the review on both admission paths; a property test then damages
valid reviews at random places and asserts no 5xx and no Python internals in any answer.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs, configuration, server
from tests import waiting
from tests.webhooks import fakeapi
from tests.webhooks.test_admission import make_review, pod

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the tests share one webhook

M, V = server.MUTATE_PATH, server.VALIDATE_GROUPS_PATH
GPU = "nvidia.com/gpu"
ANN = names.POD_GROUP_ANNOTATION


def group_review(operation: str = "CREATE", old: bool = False) -> dict[str, Any]:
    def group(n: int) -> dict[str, Any]:
        return {"apiVersion": names.API_VERSION, "kind": names.KIND,
                "metadata": {"name": "g", "namespace": "ml"}, "spec": {"resources": {GPU: n}}}

    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-g",
            "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
            "resource": {"group": names.GROUP, "version": names.VERSION, "resource": names.PLURAL},
            "namespace": "ml", "name": "g", "operation": operation,
            "userInfo": {"username": "alice"},
            "object": group(2), "oldObject": group(1) if old else None, "dryRun": False,
        },
    }


POD = make_review(pod("trainer", containers=[
    {"name": "main", "image": "x", "env": [{"name": "A", "value": "1"}],
     "resources": {"limits": {"cpu": "1"}}}], tolerations=[{"key": "a", "operator": "Exists"}]))
GROUP = group_review()
GROUP_UPDATE = group_review("UPDATE", old=True)


def damaged(base: dict[str, Any], where: str | tuple[str, ...], value: Any = ...) -> dict[str, Any]:
    """``base`` with the value at a dotted path (``request.object.spec.containers.0.env``, or a tuple of
    keys when one has a dot) replaced, or removed when no value is given."""
    body = copy.deepcopy(base)
    parts = where if isinstance(where, tuple) else where.split(".")
    *parents, last = [int(p) if p.isdigit() else p for p in parts]
    node: Any = body
    for part in parents:
        node = node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return body


def literal(base: dict[str, Any], where: str | tuple[str, ...], text: str) -> bytes:
    """``base`` as JSON with the value at ``where`` written as the raw JSON ``text`` (``1e999`` is valid
    JSON that Python reads as infinity, and that ``json.dumps`` would not write)."""
    marker = "@@literal@@"
    return json.dumps(damaged(base, where, marker)).replace(f'"{marker}"', text).encode()


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


TRUNCATED = json.dumps(POD).encode()[:120]
HUGE_INT = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":' + b"7" * 5000 + b"}}"
ENVELOPE: list[tuple[str, Any, str]] = [
    # Not a review at all: HTTP 400 with a Status.
    ("issue: request is a number", {"request": 1}, "kind is not AdmissionReview"),
    ("issue: metadata is a string", {"request": {"object": {"metadata": "x"}}}, "kind is not AdmissionReview"),
    ("issue: truncated body", b'{"request": ', "not valid JSON"),
    ("truncated review", TRUNCATED, "not valid JSON"),
    ("garbage", b"{not json", "not valid JSON"),
    ("empty body", b"", "not valid JSON"),
    ("NaN is not JSON", b'{"kind":"AdmissionReview","request":NaN}', "not valid JSON"),
    ("Infinity is not JSON", b'{"kind":"AdmissionReview","request":{"uid":-Infinity}}', "not valid JSON"),
    ("invalid UTF-8", b'{"kind":"AdmissionReview","request":"\xff\xfe"}', "not UTF-8"),
    ("top level array", [POD], "the body is an array, not an object"),
    ("top level string", "AdmissionReview", "the body is a string, not an object"),
    ("top level boolean", True, "the body is a boolean, not an object"),
    ("top level null", None, "the body is null, not an object"),
    ("nested past the parser", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("kind is Pod", damaged(POD, "kind", "Pod"), "kind is not AdmissionReview"),
    ("kind is a number", damaged(POD, "kind", 3), "kind is not AdmissionReview"),
    ("apiVersion is a number", damaged(POD, "apiVersion", 1), "apiVersion is not admission.k8s.io/v1"),
    ("apiVersion unknown", damaged(POD, "apiVersion", "admission.k8s.io/v9"), "apiVersion is not"),
    ("request is a number", damaged(POD, "request", 1), "request is a number, not an object"),
    ("request is a string", damaged(POD, "request", "x"), "request is a string, not an object"),
    ("request is an array", damaged(POD, "request", []), "request is an array, not an object"),
    ("request is null", damaged(POD, "request", None), "request is missing"),
    ("request missing", damaged(POD, "request"), "request is missing"),
    ("uid is a number", damaged(POD, "request.uid", 1), "request.uid is a number, not a string"),
    ("uid is an object", damaged(POD, "request.uid", {}), "request.uid is an object, not a string"),
    ("uid missing", damaged(POD, "request.uid"), "request.uid is missing"),
    ("uid empty", damaged(POD, "request.uid", ""), "request.uid is empty"),
    ("uid a huge number", HUGE_INT, "number"),
    ("uid 1e999", literal(POD, "request.uid", "1e999"), "request.uid is a number, not a string"),
    ("uid nested 900 deep", damaged(POD, "request.uid", nested(900)), "request.uid is an array, not a string"),
    # A review with a uid: an AdmissionReview denial, status.code 400.
    ("kind is a string", damaged(POD, "request.kind", "Pod"), "request.kind is a string, not an object"),
    ("kind missing", damaged(POD, "request.kind"), "request.kind is missing"),
    ("kind.kind a number", damaged(POD, "request.kind.kind", 7), "request.kind.kind is a number, not a string"),
    ("kind.group null", damaged(POD, "request.kind.group", None), "request.kind.group is null, not a string"),
    ("resource is a string", damaged(POD, "request.resource", "pods"), "request.resource is a string"),
    ("resource.resource a list", damaged(POD, "request.resource.resource", ["pods"]),
     "request.resource.resource is an array, not a string"),
    ("operation a number", damaged(POD, "request.operation", 1), "request.operation is a number, not a string"),
    ("operation an array", damaged(POD, "request.operation", ["CREATE"]), "request.operation is an array"),
    ("operation missing", damaged(POD, "request.operation"), "request.operation is missing"),
    ("namespace a number", damaged(POD, "request.namespace", 5), "request.namespace is a number, not a string"),
    ("subResource an object", damaged(POD, "request.subResource", {}), "request.subResource is an object"),
    ("object a string", damaged(POD, "request.object", "x"), "request.object is a string, not an object"),
    ("object an array", damaged(POD, "request.object", []), "request.object is an array, not an object"),
    ("oldObject a string", damaged(POD, "request.oldObject", "x"), "request.oldObject is a string, not an object"),
    ("dryRun a string", damaged(POD, "request.dryRun", "yes"), "request.dryRun is a string, not a boolean"),
    ("userInfo a string", damaged(POD, "request.userInfo", "alice"), "request.userInfo is a string, not an object"),
]

C0 = "request.object.spec.containers.0"
PODS: list[tuple[str, Any, str]] = [
    ("pod: object null on CREATE", damaged(POD, "request.object", None), "request.object is missing"),
    ("pod: metadata a string", damaged(POD, "request.object.metadata", "x"),
     "request.object.metadata is a string, not an object"),
    ("pod: metadata an array", damaged(POD, "request.object.metadata", []), "request.object.metadata is an array"),
    ("pod: name a number", damaged(POD, "request.object.metadata.name", 1), "request.object.metadata.name is a"),
    ("pod: annotations a string", damaged(POD, "request.object.metadata.annotations", "x"),
     "request.object.metadata.annotations is a string, not an object"),
    ("pod: annotations an array", damaged(POD, "request.object.metadata.annotations", [ANN]),
     "request.object.metadata.annotations is an array"),
    ("pod: group annotation a number", damaged(POD, "request.object.metadata.annotations", {ANN: 7}),
     f'request.object.metadata.annotations["{ANN}"] is a number, not a string'),
    ("pod: group annotation an object", damaged(POD, "request.object.metadata.annotations", {ANN: {"n": "g"}}),
     f'annotations["{ANN}"] is an object, not a string'),
    ("pod: annotation 1e400", literal(POD, ("request", "object", "metadata", "annotations", ANN), "1e400"),
     f'annotations["{ANN}"] is a number, not a string'),
    ("pod: annotation nested 500 deep", damaged(POD, "request.object.metadata.annotations", {"x": nested(500)}),
     "request.object.metadata.annotations.x is an array, not a string"),
    ("pod: labels a string", damaged(POD, "request.object.metadata.labels", "x"),
     "request.object.metadata.labels is a string, not an object"),
    ("pod: label value a boolean", damaged(POD, "request.object.metadata.labels", {"app": True}),
     "request.object.metadata.labels.app is a boolean, not a string"),
    ("pod: spec a string", damaged(POD, "request.object.spec", "x"), "request.object.spec is a string, not an object"),
    ("pod: spec an array", damaged(POD, "request.object.spec", []), "request.object.spec is an array, not an object"),
    ("pod: nodeName a number", damaged(POD, "request.object.spec.nodeName", 1),
     "request.object.spec.nodeName is a number, not a string"),
    ("pod: schedulerName an array", damaged(POD, "request.object.spec.schedulerName", []),
     "request.object.spec.schedulerName is an array, not a string"),
    ("pod: tolerations a string", damaged(POD, "request.object.spec.tolerations", "x"),
     "request.object.spec.tolerations is a string, not an array"),
    ("pod: toleration a string", damaged(POD, "request.object.spec.tolerations", ["x"]),
     "request.object.spec.tolerations[0] is a string, not an object"),
    ("pod: toleration key a number", damaged(POD, "request.object.spec.tolerations.0.key", 1),
     "request.object.spec.tolerations[0].key is a number, not a string"),
    ("pod: containers a string", damaged(POD, "request.object.spec.containers", "x"),
     "request.object.spec.containers is a string, not an array"),
    ("pod: containers an object", damaged(POD, "request.object.spec.containers", {"main": {}}),
     "request.object.spec.containers is an object, not an array"),
    ("pod: container a string", damaged(POD, "request.object.spec.containers", ["not-a-container"]),
     "request.object.spec.containers[0] is a string, not an object"),
    ("pod: container null", damaged(POD, "request.object.spec.containers", [None]),
     "request.object.spec.containers[0] is null, not an object"),
    ("pod: initContainers a number", damaged(POD, "request.object.spec.initContainers", 1),
     "request.object.spec.initContainers is a number, not an array"),
    ("pod: container name a number", damaged(POD, f"{C0}.name", 3),
     "request.object.spec.containers[0].name is a number, not a string"),
    ("pod: env a string", damaged(POD, f"{C0}.env", "A=1"), "request.object.spec.containers[0].env is a string"),
    ("pod: env entry a string", damaged(POD, f"{C0}.env", ["A=1"]),
     "request.object.spec.containers[0].env[0] is a string, not an object"),
    ("pod: env name a number", damaged(POD, f"{C0}.env.0.name", 1),
     "request.object.spec.containers[0].env[0].name is a number, not a string"),
    ("pod: env name missing", damaged(POD, f"{C0}.env.0.name"), "request.object.spec.containers[0].env[0].name is"),
    ("pod: env valueFrom a string", damaged(POD, f"{C0}.env.0.valueFrom", "x"),
     "request.object.spec.containers[0].env[0].valueFrom is a string, not an object"),
    ("pod: fieldRef an array", damaged(POD, f"{C0}.env.0.valueFrom", {"fieldRef": []}),
     "env[0].valueFrom.fieldRef is an array, not an object"),
    ("pod: resources a string", damaged(POD, f"{C0}.resources", "x"),
     "request.object.spec.containers[0].resources is a string, not an object"),
    ("pod: limits an array", damaged(POD, f"{C0}.resources.limits", []),
     "request.object.spec.containers[0].resources.limits is an array, not an object"),
    ("pod: a limit an object", damaged(POD, f"{C0}.resources.limits", {GPU: {}}),
     f'resources.limits["{GPU}"] is an object, not a quantity'),
]

GROUPS: list[tuple[str, Any, str]] = [
    ("group: object null on CREATE", damaged(GROUP, "request.object", None), "request.object is missing"),
    ("group: kind a string (issue)", damaged(GROUP, "request.kind", names.KIND), "request.kind is a string"),
    ("group: metadata a string", damaged(GROUP, "request.object.metadata", "x"),
     "request.object.metadata is a string, not an object"),
    ("group: name a number", damaged(GROUP, "request.object.metadata.name", 1),
     "request.object.metadata.name is a number, not a string"),
    ("group: spec a string (issue)", damaged(GROUP, "request.object.spec", "x"),
     "request.object.spec is a string, not an object"),
    ("group: spec an array", damaged(GROUP, "request.object.spec", []), "request.object.spec is an array"),
    ("group: resources a string", damaged(GROUP, "request.object.spec.resources", "x"),
     "request.object.spec.resources is a string, not an object"),
    ("group: resources an array", damaged(GROUP, "request.object.spec.resources", [GPU]),
     "request.object.spec.resources is an array, not an object"),
    ("group: count a string", damaged(GROUP, "request.object.spec.resources", {GPU: "2"}),
     f'request.object.spec.resources["{GPU}"] is a string, not a whole number'),
    ("group: count a boolean", damaged(GROUP, "request.object.spec.resources", {GPU: True}),
     "is a boolean, not a whole number"),
    ("group: count a fraction", damaged(GROUP, "request.object.spec.resources", {GPU: 1.5}),
     "is a number, not a whole number"),
    ("group: oldObject a string", damaged(GROUP_UPDATE, "request.oldObject", "x"),
     "request.oldObject is a string, not an object"),
    ("group: old spec a string", damaged(GROUP_UPDATE, "request.oldObject.spec", "x"),
     "request.oldObject.spec is a string, not an object"),
    ("group: old resources an array", damaged(GROUP_UPDATE, "request.oldObject.spec.resources", []),
     "request.oldObject.spec.resources is an array, not an object"),
]

TABLE = [(M, *case) for case in ENVELOPE + PODS] + [(V, *case) for case in ENVELOPE + GROUPS]


# -- one webhook for the module: the real server, real TLS, the real group cache over a fake API --------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def hook(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[server.RunningWebhook, Any]]:
    api = fakeapi.FakeApi()
    await api.start()
    api.put(fakeapi.GROUPS, fakeapi.group("ml", "trainer", {GPU: 2}))
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(Path(tmp_path_factory.mktemp("tls")))
    context = ssl.create_default_context(cadata=bundle.ca_pem.decode())
    async with client.ApiClient(configuration=client.Configuration(host=api.url)) as api_client:
        running = await server.start_webhook(tls_cert=cert, tls_key=key, api_client=api_client)
        try:
            assert running.index is not None and await running.index.wait_synced(waiting.HANG_GUARD)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
                yield running, http
        finally:
            await running.stop()
            await api.stop()


async def send(hook: tuple[server.RunningWebhook, Any], path: str, body: Any) -> tuple[int, int, str, bytes]:
    """HTTP status, the answer's code (the review's ``status.code`` when it is a review), message, raw body."""
    running, http = hook
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(running.url + path, data=data, headers={"Content-Type": "application/json"}) as r:
        raw = await r.read()
        status = r.status
    try:
        answer = json.loads(raw)
    except ValueError:
        return status, status, raw.decode(errors="replace"), raw
    if status == 200 and isinstance(answer, dict) and answer.get("kind") == "AdmissionReview":
        response = answer["response"]
        if response["allowed"]:
            return status, 200, "", raw
        return status, int(response["status"]["code"]), str(response["status"]["message"]), raw
    return status, int(answer.get("code") or status), str(answer.get("message", "")), raw


# Words that only Python's own errors put in a message: a class name, a repr, a traceback.
INTERNALS = re.compile(r"Traceback|Error\(|Exception|Error:|object has no attribute|'NoneType'|\bFile \"|<class")


@in_module_loop
@pytest.mark.parametrize(("path", "body", "problem"), [c[:1] + c[2:] for c in TABLE],
                         ids=[f"{c[0]} {c[1]}" for c in TABLE])
async def test_a_malformed_review_is_a_400_that_names_the_problem(
    hook: Any, path: str, body: Any, problem: str
) -> None:
    status, code, message, raw = await send(hook, path, body)
    assert status != 500 and code != 500, raw[:300]
    assert code == 400, raw[:300]
    assert problem in message, message
    assert not INTERNALS.search(message), message
    if status == 200:  # answered as a review: it must be one the API server accepts
        answer, sent = json.loads(raw), json.loads(body) if isinstance(body, bytes) else body
        assert answer["response"]["uid"] == sent["request"]["uid"]
        assert answer["response"]["status"]["reason"] == "BadRequest"
    else:
        assert status == 400 and json.loads(raw)["kind"] == "Status"


def test_the_table_is_large_and_covers_every_level() -> None:
    bodies = {json.dumps(b, sort_keys=True) if not isinstance(b, bytes) else b.decode(errors="replace")
              for _, _, b, _ in TABLE}
    assert len(bodies) >= 30
    for level in ("request", "uid", "kind", "resource", "object", "metadata", "annotations", "spec",
                  "containers", "env", "oldObject", "operation"):
        assert any(f"{level}" in problem for _, _, _, problem in TABLE), level


@in_module_loop
@pytest.mark.parametrize(("path", "body"), [(M, POD), (V, GROUP), (V, GROUP_UPDATE)])
async def test_the_valid_reviews_the_table_damages_are_answered(hook: Any, path: str, body: Any) -> None:
    status, code, message, _ = await send(hook, path, body)
    assert (status, code) == (200, 200), message


# -- property: damage a valid review anywhere; never a 5xx, never Python's internals -----------------------


def places(value: Any, at: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every path into a JSON value, containers included."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from places(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from places(v, (*at, i))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64, max_value=10**300)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
BASES = [(M, POD), (V, GROUP), (V, GROUP_UPDATE)]


@st.composite
def damaged_reviews(draw: st.DrawFn) -> tuple[str, Any]:
    path, base = draw(st.sampled_from(BASES))
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(places(body))[1:] or [()]))
        if not where:
            break
        node: Any = body
        for part in where[:-1]:
            node = node[part]
        if draw(st.booleans()) and isinstance(node, dict):
            del node[where[-1]]
        else:
            node[where[-1]] = draw(json_values)
    return path, body


@in_module_loop
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=damaged_reviews())
async def test_a_damaged_review_is_never_a_5xx_and_never_shows_python_internals(
    hook: Any, case: tuple[str, Any]
) -> None:
    path, body = case
    status, code, message, raw = await send(hook, path, body)
    assert status < 500 and code < 500, raw[:300]
    assert not INTERNALS.search(raw.decode(errors="replace")), raw[:300]
    if code >= 400:
        assert message, raw[:300]


# -- what the user sees: through an API server (the sandbox emulates kube-apiserver's webhook client) -----


async def test_the_user_gets_the_400_and_its_message_through_the_api_server(tmp_path: Path) -> None:
    """kube-apiserver would refuse this pod while decoding it; the sandbox decodes loosely, so the pod
    reaches the webhook as a damaged review could, and the answer shows what the API server does with
    a denial whose code is 400 under failurePolicy Fail: the user gets that 400 and our message."""
    async with Sandbox(nodes=1, kubelet_delay=0, kubeconfig_path=tmp_path / "kc") as sandbox:
        bundle = certs.generate(["127.0.0.1"])
        _, cert, key = bundle.write(tmp_path)
        running = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(sandbox.kubeconfig))
        try:
            assert running.index is not None and await running.index.wait_synced(waiting.HANG_GUARD)
            hooks = configuration.build(ca_bundle=bundle.ca_pem, url=running.url)
            assert hooks["webhooks"][0]["failurePolicy"] == "Fail"
            sandbox.create(hooks)
            sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
            damaged_pod = pod("g", containers=[{"name": "main", "image": "x", "env": "A=1"}])
            damaged_pod["metadata"]["namespace"] = "ml"
            async with aiohttp.ClientSession() as http, http.post(
                f"{sandbox.url}/api/v1/namespaces/ml/pods", json={"apiVersion": "v1", "kind": "Pod", **damaged_pod}
            ) as r:
                status, answer = r.status, await r.json()
        finally:
            await running.stop()
    assert status == 400, answer
    assert answer["reason"] == "BadRequest"
    assert answer["message"] == (
        f'admission webhook "{configuration.WEBHOOK_NAME}" denied the request: '
        "malformed AdmissionReview: request.object.spec.containers[0].env is a string, not an array"
    )
