"""Server-side apply (``PATCH`` with ``application/apply-patch+yaml``), as kube-apiserver does it.

Helm 4, ``kubectl apply --server-side`` and Flux's kustomize-controller send the whole configuration
they want and let the server merge it: the fields it names become the applier's (``fieldManager``,
required), a field another manager owns may not be changed unless ``force=true`` (409 ``Conflict``
naming the fields and the managers), a field the applier set last time and no longer names is removed
unless someone else still owns it, and an absent object is created. The steps follow
sigs.k8s.io/structured-merge-diff's ``Updater.Apply``: merge the configuration into the live object
(lists by their keys, ``fieldshapes``), prune what only this applier had set, compare with the live
object, refuse on conflicts, then hand ownership over (``managedfields``). An object that no manager
owns yet is first attributed to ``before-first-apply``, so an apply cannot silently change what an
older writer set. The result goes through admission and the store like any update; ``dryRun=All``
and optimistic concurrency (a stale ``resourceVersion`` in the configuration is a 409) come with that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import admission, catalog, errors, identity, registry, store, strategies
from deviceshare.sandbox import fieldsets as fs
from deviceshare.sandbox import managedfields as mf
from deviceshare.sandbox.fieldshapes import ATOMIC, Shape, root

Obj = dict[str, Any]
BEFORE_FIRST_APPLY = "before-first-apply"


@dataclasses.dataclass(frozen=True)
class Options:
    manager: str
    force: bool


def _invalid_options(field: str, reason: str, message: str) -> errors.ApiError:
    return errors.ApiError(
        422, "Invalid", f'PatchOptions.meta.k8s.io "" is invalid: {field}: {message}',
        details={"group": "meta.k8s.io", "kind": "PatchOptions",
                 "causes": [{"reason": reason, "message": message, "field": field}]},
    )


def options(params: Mapping[str, str], *, apply: bool) -> Options:
    """The PatchOptions of a patch, checked as the API server checks them before anything else."""
    manager = params.get("fieldManager", "")
    if not apply:
        if "force" in params:
            raise _invalid_options("force", "FieldValueForbidden",
                                   "Forbidden: may not be specified for non-apply patch")
        return Options(manager, False)
    if not manager:
        raise _invalid_options("fieldManager", "FieldValueRequired", "Required value: is required for apply patch")
    if len(manager) > 128:
        raise _invalid_options("fieldManager", "FieldValueTooLong",
                               "Too long: may not be more than 128 bytes")
    return Options(manager, params.get("force", "").lower() in ("true", "1", "t"))


def shape_of(rtype: catalog.ResourceType) -> Shape:
    return root(rtype.schema if rtype.custom else None)


def checked_config(rtype: catalog.ResourceType, ns: str | None, name: str, config: Any) -> Obj:
    """The applied configuration, checked against the URL as the real server checks it."""
    if not isinstance(config, dict):
        raise errors.bad_request("the body of an apply patch must be an object")
    if config.get("apiVersion") != rtype.api_version:
        raise errors.bad_request(f"the API version in the data ({config.get('apiVersion')}) does not match "
                                 f"the expected API version ({rtype.api_version})")
    if config.get("kind") != rtype.kind:
        raise errors.bad_request(f"the kind in the data ({config.get('kind')}) does not match "
                                 f"the expected kind ({rtype.kind})")
    checked: Obj = dict(strategies.clone(config))
    md = checked.setdefault("metadata", {})
    if not isinstance(md, dict):
        raise errors.bad_request("metadata must be an object")
    if md.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil")
    if md.setdefault("name", name) != name:
        raise errors.bad_request(f"the name of the object ({md['name']}) does not match the name on the URL ({name})")
    if rtype.namespaced and md.get("namespace", ns) != ns:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    return checked


def merge(live: Any, config: Any, shape: Shape) -> Any:
    """The configuration merged into the live value: maps by key, keyed and set lists by item, the rest replaced."""
    if isinstance(live, dict) and isinstance(config, dict) and not shape.atomic_map:
        out = dict(live)
        for key, value in config.items():
            if value is None:
                out.pop(key, None)
            elif key in live:
                out[key] = merge(live[key], value, shape.child(key)[0])
            else:
                out[key] = strategies.clone(value)
        return out
    if isinstance(live, list) and isinstance(config, list):
        return _merge_list(live, config, shape)
    return strategies.clone(config)


def _merge_list(live: list[Any], config: list[Any], shape: Shape) -> list[Any]:
    """Items of both by their path element: live-only items keep their place, the configuration's come
    in its order (SMD's zipper)."""
    kind, live_elements = fs.list_elements(shape, live + config)
    if kind == ATOMIC:
        return strategies.clone(config)
    live_elements = fs.list_elements(shape, live)[1]
    config_elements = fs.list_elements(shape, config)[1]
    wanted = dict(zip(config_elements, config, strict=True))
    had = dict(zip(live_elements, live, strict=True))
    item, out, done, next_config = shape.item(), [], set(), 0

    def take_config_until(stop: str | None) -> None:
        nonlocal next_config
        while next_config < len(config_elements):
            element = config_elements[next_config]
            next_config += 1
            if element not in done:
                done.add(element)
                out.append(merge(had[element], wanted[element], item) if element in had
                           else strategies.clone(wanted[element]))
            if element == stop:
                return

    for element, value in zip(live_elements, live, strict=True):
        if element in done:
            continue
        if element in wanted:
            take_config_until(element)
        else:
            done.add(element)
            out.append(strategies.clone(value))
    take_config_until(None)
    return out


def conflict_error(conflicts: list[tuple[mf.Entry, fs.Path]]) -> errors.ApiError:
    """409 Conflict as kube-apiserver words it, one cause per (manager, field)."""
    causes = [{"type": "FieldManagerConflict", "message": f"conflict with {e.printed()}",
               "field": fs.path_string(p)} for e, p in conflicts]
    if len(conflicts) == 1:
        entry, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {entry.printed()}: {fs.path_string(path)}"
    else:
        lines = []
        for printed in sorted({e.printed() for e, _ in conflicts}):
            lines.append(f"conflicts with {printed}:")
            lines += [f"- {fs.path_string(p)}" for e, p in conflicts if e.printed() == printed]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return errors.ApiError(409, "Conflict", message, details={"causes": causes})


def applied(rtype: catalog.ResourceType, live: Obj, config: Obj, opts: Options, subresource: str | None) -> Obj:
    """The object after applying ``config`` to ``live`` by ``opts.manager`` (not stored; raises 409 on
    conflicts unless forced). Pure: ``live`` is not changed."""
    shape, skip = shape_of(rtype), mf.ignored(rtype.has_status, subresource)
    bare = mf.bare(live)
    entries = mf.decode(strategies.meta(live).get("managedFields"))
    if not entries:  # owned by nobody yet: what is there belongs to whoever wrote it before
        first = mf.Entry(BEFORE_FIRST_APPLY, mf.UPDATE, rtype.api_version,
                         fs.without(fs.fieldset(bare, shape), skip), strategies.now())
        entries[first.identity] = first
    mine = mf.Entry(opts.manager, mf.APPLY, rtype.api_version, set(), None, subresource or "")
    last = entries.get(mine.identity)
    mine.paths = fs.without(fs.fieldset(config, shape), skip)
    mine.time = last.time if last else None
    entries[mine.identity] = mine
    merged = merge(bare, config, shape)
    if last is not None:  # prune: what this applier set last time, names no more, and nobody else owns
        owned = fs.ensure_named(set().union(*(e.paths for e in entries.values())), shape)
        merged = fs.remove_items(merged, fs.ensure_named(last.paths, shape) - owned, shape)
    result = registry.merged(rtype, bare, merged, subresource)
    diff = fs.compare(bare, result, shape)
    changed, removed = fs.without(diff.changed, skip), fs.without(diff.removed, skip)
    others = [e for e in entries.values() if e.identity != mine.identity]
    conflicts = [(e, p) for e in others for p in sorted(e.paths & changed)]
    if conflicts and not opts.force:
        raise conflict_error(conflicts)
    for entry in others:
        entry.paths -= changed | removed
    if result != bare:
        mine.time = strategies.now()
    wanted_rv = strategies.meta(config).get("resourceVersion")
    strategies.meta(result)["resourceVersion"] = wanted_rv or strategies.meta(live).get("resourceVersion")
    mf.store(result, entries)
    return result


def created(rtype: catalog.ResourceType, config: Obj, opts: Options) -> Obj:
    """A new object from ``config``, owned by the applier."""
    obj = strategies.clone(config)
    mine = mf.Entry(opts.manager, mf.APPLY, rtype.api_version,
                    fs.without(fs.fieldset(config, shape_of(rtype)), mf.ignored(rtype.has_status, None)),
                    strategies.now())
    mf.store(obj, {mine.identity: mine})
    return obj


async def apply(
    objects: store.ObjectStore,
    webhooks: admission.Admission,
    rtype: catalog.ResourceType,
    ns: str | None,
    name: str,
    subresource: str | None,
    body: Any,
    opts: Options,
    user: identity.User,
) -> tuple[Obj, int]:
    """Apply ``body`` to the named object through admission; (the stored object, 200 or 201 if created)."""
    config = checked_config(rtype, ns, name, body)
    for _ in range(10):  # redone when the object changed (or appeared) while admission ran
        try:
            live = objects.get(rtype, ns, name)
        except errors.ApiError as e:
            if e.code != 404 or subresource:
                raise
            obj = await webhooks.admit_create(rtype, ns, created(rtype, config, opts), user)
            await webhooks.validate(rtype, ns, "CREATE", obj, user=user)
            try:
                return objects.create(rtype, ns, obj), 201
            except errors.ApiError as race:
                if race.reason != "AlreadyExists":
                    raise
                continue
        result = applied(rtype, live, config, opts, subresource)
        old, new = objects.prepare_update(rtype, ns, name, None, result, subresource)
        mf.store(new, mf.decode(strategies.meta(result).get("managedFields")))  # a status write keeps old metadata
        await webhooks.validate(rtype, ns, "UPDATE", new, old, subresource=subresource or "", user=user)
        stored = objects.commit_update(rtype, old, new)
        if stored is not None:
            return stored, 200
    raise errors.conflict(rtype.plural, rtype.group, name, errors.STALE)
