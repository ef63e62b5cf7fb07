"""What a member pod may carry: the rules the webhook applies at CREATE and the operator again before binding.

The webhook sees a pod once, when it is created with the group annotation. A pod created without it
(so the webhook never saw it) and annotated later reaches the operator unchecked, so the operator runs
these same rules before it binds and refuses such a pod with the same reason. One function serves both
callers; the operator keeps only the few :class:`ContainerFacts` of each pod, not its body.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from deviceshare.api import envnames, names

# A group name becomes a label value and a URL path segment, so it must be a DNS-1123 label (also a valid
# DNS-1123 subdomain, i.e. object name): lowercase alphanumerics and '-', at most 63 characters.
GROUP_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_GROUP_NAME = 63


def group_name_problem(name: str) -> str | None:
    """Why ``name`` (the pod's group annotation) cannot name a group, or None if it can."""
    ann = names.POD_GROUP_ANNOTATION
    if not name.strip():
        return f"annotation {ann} is empty; set it to the name of a SharedDeviceGroup"
    if len(name) > MAX_GROUP_NAME or not GROUP_NAME.match(name):
        return (
            f"annotation {ann}={name[:80]!r} is not a valid group name "
            f"(lowercase letters, digits and '-', at most {MAX_GROUP_NAME} characters)"
        )
    return None


def visibility_env(resources: Iterable[str], env_names: envnames.EnvNames) -> list[str]:
    """The env var names a group's members get, once each, in resource order."""
    out: dict[str, None] = {}
    for resource in resources:
        for env in env_names.for_resource(resource):
            out[env] = None
    return list(out)


def env_entry(env_name: str) -> dict[str, Any]:
    """The env entry the webhook injects for one visibility variable."""
    field_ref = {"apiVersion": "v1", "fieldPath": names.env_field_path(env_name)}
    return {"name": env_name, "valueFrom": {"fieldRef": field_ref}}


def is_injected(entry: Mapping[str, Any]) -> bool:
    """Whether an env entry is the one :func:`env_entry` makes (the API server may have defaulted
    ``fieldRef.apiVersion`` to ``v1`` since, or not)."""
    value_from = entry.get("valueFrom")
    if "value" in entry or not isinstance(value_from, Mapping) or len(value_from) != 1:
        return False
    field_ref = value_from.get("fieldRef")
    return (
        isinstance(field_ref, Mapping)
        and field_ref.get("fieldPath") == _field_path(str(entry.get("name")))
        and field_ref.get("apiVersion", "v1") == "v1"
    )


@functools.lru_cache(maxsize=1024)  # a handful of env names, checked on every pod event the operator sees
def _field_path(env_name: str) -> str:
    return names.env_field_path(env_name)


@dataclass(frozen=True, slots=True)
class ContainerFacts:
    """What the rules read of one container: where it is, the extended resources it asks for, and the
    env vars it sets itself (any entry that is not the webhook's downward-API one)."""

    where: str  # "container 'main'" or "init container 'setup'"
    requested: tuple[tuple[str, str], ...]  # (limits|requests, resource) with a '/' in the name
    own_env: frozenset[str]
    name: str = ""  # the container's name (a CDI hand-over annotates each one by it)


def container_facts(spec: Mapping[str, Any]) -> tuple[ContainerFacts, ...]:
    """The facts of every init container and container, in that order (bad shapes count as empty)."""
    # Runs on every pod event the operator sees: plain loops, and is_injected only for valueFrom entries.
    out: list[ContainerFacts] = []
    for list_name, kind in (("initContainers", "init container"), ("containers", "container")):
        containers = spec.get(list_name)
        if not isinstance(containers, list):
            continue
        for container in containers:
            if not _is_mapping(container):
                continue
            resources = container.get("resources")
            requested: list[tuple[str, str]] = []
            if _is_mapping(resources):
                for section in ("limits", "requests"):
                    listed = resources.get(section)
                    if _is_mapping(listed):
                        requested += [(section, str(r)) for r in sorted(listed) if "/" in str(r)]
            own: list[str] = []
            env = container.get("env")
            for e in env if isinstance(env, list) else ():
                if _is_mapping(e) and ("valueFrom" not in e or not is_injected(e)):
                    own.append(str(e.get("name")))
            name = container.get("name")
            out.append(_interned(f"{kind} {name!r}", tuple(requested), frozenset(own), str(name or "")))
    return tuple(out)


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Bodies are dicts: the type check first spares the Mapping ABC's much slower isinstance.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


@functools.lru_cache(maxsize=4096)  # most pods of a workload look alike: share one object
def _interned(
    where: str, requested: tuple[tuple[str, str], ...], own_env: frozenset[str], name: str
) -> ContainerFacts:
    return ContainerFacts(where, requested, own_env, name)


def conflicts(
    containers: Sequence[ContainerFacts], resources: Iterable[str], env: Sequence[str]
) -> Iterator[str]:
    """Why the pod may not be a member of a group with ``resources`` and visibility ``env``: it asks the
    device plugin for one of the group's resources, or sets one of the group's visibility env vars."""
    group_resources = set(resources)
    wanted = set(env)
    for c in containers:
        for section, resource in c.requested:
            if resource in group_resources:
                yield (
                    f"{c.where} requests {resource} in resources.{section}, but the device group "
                    f"already provides it; remove it so the device plugin does not allocate it twice"
                )
        for name in sorted(c.own_env & wanted):
            yield (
                f"{c.where} sets env var {name} itself, which would override the devices of the "
                f"group; remove it (deviceshare injects it)"
            )
