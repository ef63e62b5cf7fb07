"""Test helpers: a plain HTTP client (tests see exactly what clients see) and object builders."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

SDG = "/apis/deviceshare.io/v1alpha1/namespaces/default/shareddevicegroups"
PODS = "/api/v1/namespaces/default/pods"


class Http:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        hdrs = {"Content-Type": content_type, **(headers or {})}
        async with self.session.request(
            method, self.base + path, data=data, params=params, headers=hdrs
        ) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)

    async def watch(self, path: str, params: dict[str, str], limit: int = 100) -> list[dict[str, Any]]:
        """Read a watch stream until the server ends it (use timeoutSeconds) or ``limit`` events."""
        events: list[dict[str, Any]] = []
        async with self.session.get(self.base + path, params={"watch": "true", **params}) as r:
            assert r.status == 200
            async for line in r.content:
                if line.strip():
                    events.append(json.loads(line))
                    if len(events) >= limit:
                        break
        return events


def sdg(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"resources": {"nvidia.com/gpu": gpus}, **spec},
    }


def pod(name: str, **extra: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default", **extra.pop("metadata", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **extra},
    }
