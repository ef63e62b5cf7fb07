"""The Eviction API and PodDisruptionBudgets, through the sandbox's HTTP API as kube-apiserver answers them.

A budget's status is the disruption controller's arithmetic; an eviction reads it, decrements it at
once when it allows a disruption, refuses with 429 when it does not, and deletes the pod gracefully
(the kubelet simulation then stops and removes it). Every wait here waits for the store event that
makes its condition true.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import PODS, Http, pod

PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


async def until(sandbox: Sandbox, check: Callable[[], Any], what: str) -> Any:
    """``check()`` once true: asked now and after every change the store makes (no polling)."""
    changed = asyncio.Event()

    def seen(_: object) -> None:
        changed.set()

    sandbox.store.listeners.append(seen)
    try:
        async with asyncio.timeout(30):  # a guard against a hang, not a wait: the event comes in milliseconds
            while not (found := check()):
                changed.clear()
                await changed.wait()
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None
    finally:
        sandbox.store.listeners.remove(seen)
    return found


class Recorder:
    """Every watch event of one object, in order (what an informer would see); ``log`` has all objects'."""

    def __init__(self, sandbox: Sandbox, name: str) -> None:
        self.sandbox, self.name, self.events = sandbox, name, list[tuple[str, dict[str, Any]]]()
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []  # (plural, type, name, object)
        sandbox.store.listeners.append(self)

    def __call__(self, event: Any) -> None:
        self.log.append((event.key[1], event.type, event.obj["metadata"]["name"], event.obj))
        if event.key == ("", "pods") and event.obj["metadata"]["name"] == self.name:
            self.events.append((event.type, event.obj))

    def close(self) -> None:
        self.sandbox.store.listeners.remove(self)


def eviction(name: str, version: str = "policy/v1", **options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": version, "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}
    }
    if options:
        body["deleteOptions"] = options
    return body


def budget(name: str, selector: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": {"name": name, "namespace": "default"}, "spec": dict(spec)}
    if selector is not None:
        body["spec"]["selector"] = selector
    return body


async def running(sandbox: Sandbox, http: Http, *names: str, app: str = "web", node: str = "gpu-node-0") -> None:
    for name in names:
        status, _ = await http.call("POST", PODS, pod(name, metadata={"labels": {"app": app}}))
        assert status == 201
        sandbox.bind("default", name, node)
    await until(sandbox, lambda: all(
        (sandbox.get("pods", n, "default") or {}).get("status", {}).get("phase") == "Running" for n in names
    ), f"{names} running")


async def processed(sandbox: Sandbox, name: str, **expected: int) -> dict[str, Any]:
    """The budget's status once the controller has counted what ``expected`` says."""
    def check() -> dict[str, Any] | None:
        found = sandbox.get("pdb", name, "default") or {}
        status = found.get("status") or {}
        done = status.get("observedGeneration") == found["metadata"]["generation"]
        return status if done and all(status.get(k) == v for k, v in expected.items()) else None

    found: dict[str, Any] = await until(sandbox, check, f"budget {name} at {expected}")
    return found


async def test_an_eviction_without_a_budget_deletes_the_pod_gracefully(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "p")
    seen = Recorder(sandbox, "p")
    status, answer = await http.call("POST", f"{PODS}/p/eviction", eviction("p"))
    assert (status, answer) == (201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                      "code": 201})
    await until(sandbox, lambda: seen.events and seen.events[-1][0] == "DELETED", "the kubelet removes the pod")
    seen.close()
    marked, stopping, stopped, gone = seen.events
    target = next(c for c in marked[1]["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["status"], target["reason"], target["message"]) == (
        "True", "EvictionByEvictionAPI", "Eviction API: evicting")
    assert not marked[1]["metadata"].get("deletionTimestamp")
    assert stopping[1]["metadata"]["deletionGracePeriodSeconds"] == 30 and stopping[1]["metadata"]["deletionTimestamp"]
    assert stopping[1]["status"]["phase"] == "Running"  # still running: it is given its grace period
    assert (stopped[0], stopped[1]["status"]["phase"], gone[0]) == ("MODIFIED", "Failed", "DELETED")


async def test_a_budget_that_allows_no_disruption_refuses_with_429(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a", "b")
    await http.call("POST", PDBS, budget("web", {"matchLabels": {"app": "web"}}, minAvailable=2))
    assert await processed(sandbox, "web", disruptionsAllowed=0, currentHealthy=2, desiredHealthy=2, expectedPods=2)
    async with http.session.post(http.base + f"{PODS}/a/eviction", json=eviction("a")) as r:
        status, answer, retry = r.status, await r.json(), r.headers.get("Retry-After")
    assert (status, answer["reason"], retry) == (429, "TooManyRequests", None)
    assert answer["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert answer["details"]["causes"] == [
        {"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}
    ]
    assert not sandbox.get("pods", "a", "default")["metadata"].get("deletionTimestamp")  # type: ignore[index]


async def test_an_allowed_eviction_uses_the_disruption_at_once(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a", "b", "c")
    await http.call("POST", PDBS, budget("web", {"matchLabels": {"app": "web"}}, minAvailable=2))
    await processed(sandbox, "web", disruptionsAllowed=1, currentHealthy=3)
    seen = Recorder(sandbox, "a")
    status, _ = await http.call("POST", f"{PODS}/a/eviction", eviction("a"))
    assert status == 201
    seen.close()
    first = next(i for i, (plural, *_) in enumerate(seen.log) if plural == "poddisruptionbudgets")
    deleting = next(i for i, (plural, _, _, obj) in enumerate(seen.log)
                    if plural == "pods" and obj["metadata"].get("deletionTimestamp"))
    decremented = seen.log[first][3]["status"]
    assert first < deleting  # the budget is charged before the pod starts to go, by the eviction itself
    assert decremented["disruptionsAllowed"] == 0 and list(decremented["disruptedPods"]) == ["a"]
    status, answer = await http.call("POST", f"{PODS}/b/eviction", eviction("b"))
    assert status == 429 and "needs 2 healthy pods" in answer["details"]["causes"][0]["message"]
    await until(sandbox, lambda: sandbox.get("pods", "a", "default") is None, "a removed")
    recounted = await processed(sandbox, "web", currentHealthy=2, expectedPods=2)
    assert recounted["disruptionsAllowed"] == 0 and "disruptedPods" not in recounted
    condition = recounted["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "DisruptionAllowed", "False", "InsufficientPods")


async def test_a_pod_under_two_budgets_is_refused_with_500(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a")
    await http.call("POST", PDBS, budget("one", {"matchLabels": {"app": "web"}}, minAvailable=0))
    await http.call("POST", PDBS, budget("all", {}, maxUnavailable=1))  # policy/v1: {} selects every pod
    status, answer = await http.call("POST", f"{PODS}/a/eviction", eviction("a"))
    assert status == 500
    assert answer["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    )


async def test_pending_pods_go_and_unready_ones_only_when_the_budget_is_healthy(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a", "b")
    await http.call("POST", PDBS, budget("web", {"matchLabels": {"app": "web"}}, minAvailable=1))
    await processed(sandbox, "web", disruptionsAllowed=1)
    await http.call("POST", PODS, pod("waiting", metadata={"labels": {"app": "web"}}))  # never bound
    status, _ = await http.call("POST", f"{PODS}/waiting/eviction", eviction("waiting"))
    assert status == 201 and sandbox.get("pods", "waiting", "default") is None  # no budget asked, gone at once

    def unready(p: dict[str, Any]) -> None:
        p["status"]["conditions"] = [c for c in p["status"]["conditions"] if c["type"] != "Ready"]

    sandbox.store.write_status(sandbox.store.rtype("pods"), "default", "b", unready)
    await processed(sandbox, "web", currentHealthy=1, desiredHealthy=1, disruptionsAllowed=0)
    status, _ = await http.call("POST", f"{PODS}/b/eviction", eviction("b"))
    assert status == 201  # unhealthy, and the budget is met without it: no disruption used
    assert sandbox.get("pdb", "web", "default")["status"]["disruptionsAllowed"] == 0  # type: ignore[index]


async def test_budgets_over_a_controllers_scale(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=0.01, deployments=True) as sb:
        sb.create({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        })
        await until(sb, lambda: len(sb.list("pods", "default")) == 4, "four replicas")
        for p in sb.list("pods", "default"):
            sb.bind("default", p["metadata"]["name"], "gpu-node-0")
        sb.create(budget("quarter", {"matchLabels": {"app": "web"}}, maxUnavailable="25%"))
        assert await processed(sb, "quarter", expectedPods=4, desiredHealthy=3, currentHealthy=4, disruptionsAllowed=1)
        sb.create(budget("half", {"matchLabels": {"app": "other"}}, minAvailable="50%"))
        assert await processed(sb, "half", expectedPods=0, desiredHealthy=0, disruptionsAllowed=0)


async def test_a_percentage_over_pods_without_a_controller_allows_nothing(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a", "b")
    await http.call("POST", PDBS, budget("web", {"matchLabels": {"app": "web"}}, maxUnavailable="50%"))
    assert await processed(sandbox, "web", expectedPods=0, currentHealthy=2, disruptionsAllowed=0)


@pytest.fixture
async def no_controller(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=1, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=0.01, disruption=False) as sb:
        yield sb


async def test_a_budget_not_yet_counted_answers_429_retry_after_10(no_controller: Sandbox) -> None:
    import aiohttp

    sb = no_controller
    async with aiohttp.ClientSession() as session:
        http = Http(session, sb.url)
        await running(sb, http, "a")
        await http.call("POST", PDBS, budget("web", {"matchLabels": {"app": "web"}}, minAvailable=0))
        async with session.post(sb.url + f"{PODS}/a/eviction", json=eviction("a")) as r:
            status, answer, retry = r.status, await r.json(), r.headers.get("Retry-After")
    assert (status, retry, answer["details"]["retryAfterSeconds"]) == (429, "10", 10)
    cause = answer["details"]["causes"][0]["message"]
    assert cause == "The disruption budget web is still being processed by the server."


@pytest.mark.parametrize(
    ("path", "body", "code", "words"),
    [
        (f"{PODS}/a/eviction", eviction("b"), 400, "name in URL does not match name in Eviction object"),
        (f"{PODS}/a/eviction", {**eviction("a"), "kind": "Binding"}, 400, "not a Eviction object"),
        (f"{PODS}/ghost/eviction", eviction("ghost"), 404, 'pods "ghost" not found'),
    ],
)
async def test_malformed_evictions(sandbox: Sandbox, http: Http, path: str, body: Any, code: int, words: str) -> None:
    await running(sandbox, http, "a")
    status, answer = await http.call("POST", path, body)
    assert status == code and words in answer["message"]


async def test_v1beta1_and_dry_run(sandbox: Sandbox, http: Http) -> None:
    await running(sandbox, http, "a")
    seen = Recorder(sandbox, "a")
    status, _ = await http.call("POST", f"{PODS}/a/eviction", eviction("a", "policy/v1beta1"), params={"dryRun": "All"})
    assert status == 201 and seen.events == []  # every check made, nothing written
    status, _ = await http.call("POST", f"{PODS}/a/eviction", eviction("a", "policy/v1beta1", gracePeriodSeconds=5))
    assert status == 201
    await until(sandbox, lambda: seen.events and seen.events[-1][0] == "DELETED", "a removed")
    seen.close()
    assert seen.events[1][1]["metadata"]["deletionGracePeriodSeconds"] == 5


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"minAvailable": 1, "maxUnavailable": 1}, "minAvailable and maxUnavailable cannot be both set"),
        ({"minAvailable": "120%"}, "spec.minAvailable: Invalid value: \"120%\": must not be greater than 100%"),
        ({"maxUnavailable": -1}, "spec.maxUnavailable: Invalid value: -1: must be greater than or equal to 0"),
        ({"minAvailable": "half"}, "must be an integer or percentage (e.g '5%')"),
    ],
)
async def test_budgets_are_validated(http: Http, spec: dict[str, Any], words: str) -> None:
    status, answer = await http.call("POST", PDBS, budget("bad", {"matchLabels": {"app": "web"}}, **spec))
    assert (status, answer["reason"]) == (422, "Invalid") and words in answer["message"], answer["message"]


async def test_discovery_names_the_eviction_subresource(http: Http) -> None:
    _, found = await http.call("GET", "/api/v1")
    entry = next(r for r in found["resources"] if r["name"] == "pods/eviction")
    assert (entry["kind"], entry["group"], entry["version"], entry["verbs"]) == ("Eviction", "policy", "v1", ["create"])
