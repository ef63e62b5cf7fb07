"""Dynamic Resource Allocation (``resource.k8s.io/v1``, CONTRACT §13): the watches of ResourceSlices, DeviceClasses
and ResourceClaims, their lists for a rebuild, and the write of a claim's ``status`` (allocation and
``reservedFor``, as kube-scheduler writes them: KEP-4381). The claim object itself (create, finalizers, delete,
read) is ``draclaims.py``'s.

A claim status write is conditional on the resourceVersion it was computed from (409: read again, decide again);
a lost answer is read back (``readback.claim_status``) and sent again only while the claim still shows the version
it was conditional on, so at most one copy can land.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import watching

from .. import readback
from .draclaims import ClaimWrites, claim_path
from .errors import Gone
from .listing import Body, Collections

VERSION = "v1"
SLICES, CLASSES, CLAIMS = "resourceslices", "deviceclasses", "resourceclaims"
WATCHED = (SLICES, CLASSES, CLAIMS)  # each listed at a rebuild and watched (the RBAC test reads this tuple)
ClaimKey = tuple[str, str]


class DraReads(Collections, ClaimWrites):
    def dra_reflector(self, plural: str, sink: watching.Sink, *, resume_from: str | None = None) -> watching.Reflector:
        """A list+watch of every object of ``plural`` (``resourceslices``, ``deviceclasses``, ``resourceclaims``
        in all namespaces), feeding ``sink``."""
        if plural not in WATCHED:
            raise ValueError(f"not a DRA kind the operator watches: {plural}")
        call = functools.partial(
            k8s.CustomObjectsApi(self._client).list_cluster_custom_object, names.DRA_API_GROUP, VERSION, plural)
        return watching.Reflector(
            call, sink, name=plural, watch_timeout_s=self.watch_timeout_s, request_timeout_s=self.request_timeout,
            idle_timeout_s=self.watch_idle_s, resume_from=resume_from,
        )

    async def list_dra(self, plural: str) -> watching.Listing[Body]:
        """Every object of one of the ``WATCHED`` kinds, for a rebuild."""
        if plural == SLICES:
            return await self._list(f"/apis/{names.DRA_API_VERSION}/resourceslices", "list resourceslices")
        if plural == CLASSES:
            return await self._list(f"/apis/{names.DRA_API_VERSION}/deviceclasses", "list deviceclasses")
        if plural == CLAIMS:
            return await self._list(f"/apis/{names.DRA_API_VERSION}/resourceclaims", "list resourceclaims")
        raise ValueError(f"not a DRA kind the operator watches: {plural}")

    async def patch_claim_status(
        self, key: ClaimKey, status: Mapping[str, Any], *, uid: str, resource_version: str
    ) -> dict[str, Any]:
        """Merge-patch ``status`` fields (``None`` removes one), conditional on ``resource_version``; the claim
        as the API shows it after the write. ``Conflict`` when it changed, ``Gone`` when it no longer exists."""
        what = f"patch status of resourceclaim {key[0]}/{key[1]}"
        body = {"status": dict(status), "metadata": {"resourceVersion": resource_version, "uid": uid}}
        judge = functools.partial(readback.claim_status, uid=uid, written=status, precondition=resource_version)
        shown = await self._claim_write(claim_path(key) + "/status", key, what, body, "resourceclaims/status", judge)
        if shown is None:  # (a status write never deletes the claim: LANDED comes with the claim read back)
            raise Gone(f"{what}: the claim no longer exists")
        return shown
