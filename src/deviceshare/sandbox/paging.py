"""Lists in pages: ``limit`` and ``continue``, as kube-apiserver serves them.

A client that lists 150,000 pods at once holds all of them in memory before it can use one; clients page
instead (client-go's reflector asks for 500 at a time) and kube-apiserver answers each page with
``metadata.continue``, a token for the next one, until the last page has none. Its pages are all read at the
first page's resourceVersion (etcd keeps the revision); the sandbox keeps no history of objects, so the first
page takes a snapshot of the *keys* in order and each later page serves the objects under its slice of them as
they are now, leaving out those deleted since. The list's resourceVersion stays the first page's, so a client
that watches from it afterwards still sees every change made while it paged, as events (objects changed
meanwhile may also show their newer state in a later page: a watch from the list's version delivers that
version again, which a client that compares versions ignores).

A token whose snapshot has been forgotten (only the latest ``KEPT`` are kept) is answered 410 Gone, reason
``Expired``, as kube-apiserver answers a token whose revision has been compacted: the client lists afresh.
"""

from __future__ import annotations

import base64
import collections
import itertools

import orjson

from deviceshare.sandbox import catalog, errors, selectors, store

KEPT = 32

Key = tuple[str, str]


class Pages:
    """Key snapshots of the lists being paged through, by token id."""

    def __init__(self) -> None:
        self._snapshots: collections.OrderedDict[int, tuple[list[Key], str]] = collections.OrderedDict()
        self._ids = itertools.count(1)

    def page(
        self,
        objects: store.ObjectStore,
        rtype: catalog.ResourceType,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        limit: int | None,
        token: str | None,
    ) -> tuple[list[bytes], str, str | None]:
        """(the page's objects as JSON, the list's resourceVersion, the next page's token or None)."""
        if token:
            snapshot_id, start = _decode(token)
            found = self._snapshots.get(snapshot_id)
            if found is None:
                raise errors.gone("The provided continue parameter is too old to display a consistent list "
                                  "result. You can start a new list without the continue parameter.")
            keys, rv = found
        else:
            snapshot_id, start = next(self._ids), 0
            keys, rv = objects.keys(rtype, namespace), objects.resource_version
            self._snapshots[snapshot_id] = (keys, rv)
            while len(self._snapshots) > KEPT:
                self._snapshots.popitem(last=False)
        # Up to ``limit`` matching objects: with a selector a page may need more keys than ``limit``.
        encoded: list[bytes] = []
        end = start
        while end < len(keys) and (limit is None or len(encoded) < limit):
            step = keys[end: end + (limit - len(encoded) if limit else len(keys))]
            encoded += objects.list_encoded(rtype, namespace, labels, fields, keys=step)[0]
            end += len(step)
        if end >= len(keys):
            self._snapshots.pop(snapshot_id, None)
            return encoded, rv, None
        return encoded, rv, _encode(snapshot_id, end)


def _encode(snapshot_id: int, start: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"s": snapshot_id, "i": start})).decode()


def _decode(token: str) -> tuple[int, int]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["s"]), int(data["i"])
    except (ValueError, KeyError, TypeError) as e:
        raise errors.bad_request(f"continue key is not valid: {e}") from e
