"""The reflector's relist in pages against the sandbox: the watch runs beside the rest of the list, so what
happens meanwhile is seen at once, and the list's older copies of those objects never overwrite it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client, config

from deviceshare.kube import watching
from deviceshare.sandbox import Sandbox
from tests import waiting

NS = "relist"


class Recorder:
    """A paged sink that keeps the collection by name, as the operator's feeds and the webhook's caches do, and
    notes what came how."""

    def __init__(self) -> None:
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.pages = 0
        self.ended: list[str | None] = []
        self._listed: set[str] = set()

    def replace(self, objects: list[Mapping[str, Any]], resource_version: str | None = None) -> None:
        self.begin()
        self.page(objects)
        self.end(resource_version)

    def begin(self) -> None:
        self._listed = set()

    def page(self, objects: list[Mapping[str, Any]]) -> None:
        self.pages += 1
        for obj in objects:
            name = obj["metadata"]["name"]
            self._listed.add(name)
            self.objects[name] = obj  # taken as it comes: a stale copy handed over would show in the asserts

    def end(self, resource_version: str | None) -> None:
        self.ended.append(resource_version)
        for name in [n for n in self.objects if n not in self._listed]:
            del self.objects[name]  # what the whole list lacks was deleted

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.events.append((event_type, name))
        if event_type == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj


def _cm(name: str, value: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS}, "data": {"v": value}}


async def test_a_relist_in_pages_watches_beside_its_pages_and_keeps_what_the_watch_brought(sandbox: Sandbox) -> None:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(sandbox.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": NS}})
        for i in range(6):
            await core.create_namespaced_config_map(NS, _cm(f"cm{i}"))

        second_page = asyncio.Event()  # the list's second page is asked for only once this is set
        asked: list[dict[str, Any]] = []

        async def gated_list(**kwargs: Any) -> Any:
            if not kwargs.get("watch"):
                asked.append(kwargs)
                if kwargs.get("_continue"):
                    await second_page.wait()
            return await functools.partial(core.list_namespaced_config_map, NS)(**kwargs)

        sink = Recorder()
        reflector = watching.Reflector(gated_list, sink, name="configmaps", page_size=3)
        task = asyncio.create_task(reflector.run())
        try:
            # The first page (cm0..cm2) is in; the second (cm3..cm5) is held: the watch must already run.
            await waiting.until(lambda: sandbox.open_watches("configmaps") == 1, "the watch beside the list")
            assert sink.pages == 1 and not sink.ended and not reflector.synced.is_set()

            await core.create_namespaced_config_map(NS, _cm("new"))  # after the list's snapshot
            await core.patch_namespaced_config_map("cm4", NS, {"data": {"v": "2"}})  # on the page still to come
            await core.delete_namespaced_config_map("cm5", NS)  # likewise
            await waiting.until(lambda: ("DELETED", "cm5") in sink.events, "the watch's events, list unfinished")
            assert "new" in sink.objects and not sink.ended  # seen before the list has ended

            second_page.set()
            await reflector.wait_synced(waiting.HANG_GUARD)
            assert len(sink.ended) == 1 and [bool(a.get("_continue")) for a in asked] == [False, True]
            # The second page's copies of cm4 (v=1) and cm5 are from before the watch's changes: dropped.
            assert sorted(sink.objects) == ["cm0", "cm1", "cm2", "cm3", "cm4", "new"]
            assert sink.objects["cm4"]["data"] == {"v": "2"}

            # The same watch goes on after the list; no second one was opened, nothing was listed again.
            await core.create_namespaced_config_map(NS, _cm("later"))
            await waiting.until(lambda: "later" in sink.objects, "an event after the list")
            assert sandbox.open_watches("configmaps") == 1 and len(asked) == 2 and reflector.relists == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_relist_of_one_page_watches_after_it_as_before(sandbox: Sandbox) -> None:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(sandbox.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": NS}})
        await core.create_namespaced_config_map(NS, _cm("only"))
        sink = Recorder()
        reflector = watching.Reflector(functools.partial(core.list_namespaced_config_map, NS), sink,
                                       name="configmaps", page_size=3)
        task = asyncio.create_task(reflector.run())
        try:
            await reflector.wait_synced(waiting.HANG_GUARD)
            await waiting.until(lambda: sandbox.open_watches("configmaps") == 1, "the watch after the list")
            await core.delete_namespaced_config_map("only", NS)
            await waiting.until(lambda: not sink.objects, "the deletion")
            assert sink.ended and sink.events == [("DELETED", "only")]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_watch_on_a_silently_dead_connection_is_resumed_from_where_it_was(tmp_path: Any) -> None:
    """A connection that dies without a word (a node or a load balancer's flow gone: no FIN, no RST) leaves a
    watch waiting for ever unless silence itself ends it: bookmarks come (kube-apiserver: every minute; here every
    0.05 s), so a watch silent for ``idle_timeout_s`` is dropped and resumed from its resourceVersion, no relist."""
    async with Sandbox(nodes=0, kubelet_delay=None, bookmark_interval=0.05, front=True,
                       kubeconfig_path=tmp_path / "kubeconfig") as box:
        assert box.front is not None
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(box.kubeconfig), client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            core = client.CoreV1Api(api)
            await core.create_namespace({"metadata": {"name": NS}})
            sink = Recorder()
            reflector = watching.Reflector(functools.partial(core.list_namespaced_config_map, NS), sink,
                                           name="configmaps", idle_timeout_s=0.5)
            task = asyncio.create_task(reflector.run())
            try:
                await reflector.wait_synced(waiting.HANG_GUARD)
                await waiting.until(lambda: box.open_watches("configmaps") == 1, "the watch after the list")
                assert box.front.black_hole() >= 1
                box.create({"apiVersion": "v1", "kind": "ConfigMap", **_cm("after")})
                await waiting.until(lambda: "after" in sink.objects, "the change, on a resumed watch")
                assert box.front.swallowed > 0, "nothing went into the black hole: the fault did not fire"
                assert reflector.relists == 1, "the watch was listed again instead of resumed"
                assert sink.events == [("ADDED", "after")]
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
