"""Every API call the node agent makes: read its own Node, and merge-patch the annotations it owns.

A write changes only the annotations that differ (a JSON merge patch of ``metadata.annotations``), so an
unchanged node costs no write at all, and the agent never touches labels, taints or status. It carries no
resourceVersion precondition: the agent owns these keys outright, while the kubelet rewrites the Node's
status every few minutes, so a precondition on the whole object would only turn into needless 409s.

Uncertain outcomes follow the project's rule (COORDINATION.md, issue 20): a write whose answer is lost (a
5xx such as 504, a timeout, a dropped connection) may have landed, so the Node is read back; if it carries
what was written the write counts as landed (``uncertain_resolved``), otherwise it failed and the next
sync tries again. ``deviceshare_node_agent_annotation_writes_total{result}`` counts every write.
"""

from __future__ import annotations

import logging
import urllib.parse

import aiohttp
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry, Counter

from deviceshare.kube import rest
from deviceshare.nodeagent import readings

logger = logging.getLogger("deviceshare.nodeagent.publishing")

MERGE_PATCH = "application/merge-patch+json"
RESULTS = ("ok", "conflict", "uncertain_resolved", "failed")


class NodeNotFound(Exception):
    """The agent's Node does not exist (a wrong --node-name, or the node was deleted)."""


class WriteFailed(Exception):
    """A write that did not land (refused, or lost and not found on the Node when read back)."""


def writes_counter(registry: CollectorRegistry) -> Counter:
    counter = Counter(
        "deviceshare_node_agent_annotation_writes",
        "Annotation writes of the node agent to its Node, by result", ["result"], registry=registry,
    )
    for result in RESULTS:
        counter.labels(result)  # every series shows from the start, at 0
    return counter


class NodeApi:
    """The agent's view of its Node through the API server."""

    def __init__(self, api: k8s.ApiClient, node: str, writes: Counter, *, timeout: float = 10.0) -> None:
        self._api = api
        self.node = node
        self._writes = writes
        self._timeout = timeout
        self._path = f"/api/v1/nodes/{urllib.parse.quote(node, safe='')}"

    async def read(self) -> readings.Annotations:
        """The owned annotations as the Node carries them now."""
        try:
            body = await rest.call(self._api, "GET", self._path, timeout=self._timeout)
        except rest.ApiError as e:
            if e.status == 404:
                raise NodeNotFound(
                    f"node {self.node} does not exist (--node-name, or NODE_NAME from spec.nodeName)"
                ) from e
            raise
        return readings.published((body.get("metadata") or {}).get("annotations"))

    async def publish(self, current: readings.Annotations, desired: readings.Annotations) -> readings.Annotations:
        """Write what differs between ``current`` (what the Node carries, as last known) and ``desired``;
        return what the Node carries afterwards. Raises :class:`WriteFailed` when the write did not land."""
        patch = readings.changes(current, desired)
        if not patch:
            return current
        body = {"metadata": {"annotations": patch}}
        try:
            await rest.call(self._api, "PATCH", self._path, body, content_type=MERGE_PATCH, timeout=self._timeout)
        except rest.ApiError as e:
            if e.status < 500:
                result = "conflict" if e.status == 409 else "failed"
                self._writes.labels(result).inc()
                raise WriteFailed(f"the API server refused the annotations of node {self.node}: {e}") from e
            return await self._resolve(patch, f"{e.status} {e.message}")
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            return await self._resolve(patch, f"{type(e).__name__}: {e}")
        self._writes.labels("ok").inc()
        logger.info("node %s: published %s", self.node, ", ".join(sorted(patch)))
        return {**current, **patch}

    async def _resolve(self, patch: readings.Annotations, why: str) -> readings.Annotations:
        """The answer was lost: did the write land? Only the Node itself can say."""
        logger.warning("node %s: the answer to our annotation write was lost (%s); reading the node back",
                       self.node, why)
        try:
            now = await self.read()
        except (rest.ApiError, TimeoutError, aiohttp.ClientError, OSError, NodeNotFound) as e:
            self._writes.labels("failed").inc()
            raise WriteFailed(f"write outcome unknown and the node could not be read back: {e}") from e
        if all(now.get(k) == v for k, v in patch.items()):
            self._writes.labels("uncertain_resolved").inc()
            logger.info("node %s: the write had landed", self.node)
            return now
        self._writes.labels("failed").inc()
        raise WriteFailed(f"write to node {self.node} did not land ({why}); will try again")

