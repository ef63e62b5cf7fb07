"""The operator's only door to the API server: every read it makes outside its watches, and every write.

- :mod:`.errors`: API failures converted once into errors by intent (``Conflict``, ``Gone``, ``Invalid``,
  ``RetryLater``, and for writes ``Uncertain`` and ``Fenced``), and the fence a write must pass;
- :mod:`.transport`: one request: reads; writes fenced (a replica that is not the leader sends none), bounded
  (the server is told when to give up), counted (``deviceshare_api_writes_total``) and, after a lost answer,
  resolved by reading the object back;
- :mod:`.cluster`: :class:`ClusterApi`, the reads and writes of groups, pods, Leases and Events.

Every name in a path is URL-quoted: names come from annotations a pod's owner writes, and a name such as
``../shareddevicegroups?watch=true`` must stay one path segment, not become another request.
"""

from __future__ import annotations

from .cluster import ClusterApi
from .errors import (
    Conflict,
    Expired,
    Fence,
    Fenced,
    Gone,
    Invalid,
    OpenFence,
    RetryLater,
    TooManyRequests,
    Uncertain,
)
from .transport import MERGE_PATCH, STRATEGIC_MERGE_PATCH, GroupKey, PodKey, _group_path, _pod_path, now_rfc3339

__all__ = [
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ClusterApi",
    "Conflict",
    "Expired",
    "Fence",
    "Fenced",
    "Gone",
    "GroupKey",
    "Invalid",
    "OpenFence",
    "PodKey",
    "RetryLater",
    "TooManyRequests",
    "Uncertain",
    "_group_path",
    "_pod_path",
    "now_rfc3339",
]
