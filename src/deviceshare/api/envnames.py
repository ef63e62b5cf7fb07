"""Which env var(s) make a device resource visible inside a container (CONTRACT §4), and which
carry a sharing group's limits (CONTRACT §7).

The defaults follow each vendor's container runtime. Admins can override or extend them with a
mapping whose keys are either a resource prefix ending in ``/`` (``nvidia.com/``) or an exact
resource name (``example.com/fpga``); the most specific key wins. The webhook (which wires the
env vars) and the operator (which writes their values) must agree, so both read this one module.

Limits of a compute/memory share default to NVIDIA MPS's variables for ``nvidia.com/``:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (a percentage) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
(``0=12288M,1=12288M``). HAMi-core reads ``CUDA_DEVICE_SM_LIMIT`` and ``CUDA_DEVICE_MEMORY_LIMIT``
(``12288m``) instead; configure it with ``limitEnvNames: {"nvidia.com/": "hami-core"}`` or name the
variables yourself: ``{"nvidia.com/": {compute: X, memory: Y, memoryFormat: mps|hami}}``. Tiles are
always handed over in ``ZE_AFFINITY_MASK`` (``<ordinal>.<tile>``), as Intel's runtime reads them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml

from deviceshare import errors

if TYPE_CHECKING:
    from deviceshare.api import models

DEFAULT_ENV_NAMES: Mapping[str, tuple[str, ...]] = {
    "nvidia.com/": ("NVIDIA_VISIBLE_DEVICES",),
    "amd.com/": ("AMD_VISIBLE_DEVICES",),
    "huawei.com/": ("ASCEND_VISIBLE_DEVICES",),
    "gpu.intel.com/": ("ZE_AFFINITY_MASK",),
    "habana.ai/": ("HABANA_VISIBLE_DEVICES",),
}

_T = TypeVar("_T")
MemoryFormat = Literal["mps", "hami"]


@dataclass(frozen=True, slots=True)
class LimitEnvNames:
    """The env vars that carry a share's limits to the container; None: that limit is not passed."""

    compute: str | None
    memory: str | None
    memory_format: MemoryFormat = "mps"  # mps: "0=12288M,1=12288M"; hami: "12288m" for every device


MPS_LIMITS = LimitEnvNames("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "mps")
HAMI_CORE_LIMITS = LimitEnvNames("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT", "hami")
DEFAULT_LIMIT_ENV_NAMES: Mapping[str, LimitEnvNames] = {"nvidia.com/": MPS_LIMITS}
PRESETS: Mapping[str, LimitEnvNames] = {"mps": MPS_LIMITS, "hami-core": HAMI_CORE_LIMITS}
TILE_ENV_NAME = "ZE_AFFINITY_MASK"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class EnvNameConfigError(errors.ConfigError, ValueError):
    """The env-name mapping given by an admin is malformed."""


def is_device_resource(name: str) -> bool:
    """An extended resource name of the form ``vendor.tld/name``."""
    return bool(_RESOURCE.match(name))


def fallback_env_name(resource: str) -> str:
    """``vendor.tld/name`` -> ``VENDOR_NAME_VISIBLE_DEVICES`` (upper-cased, non-alphanumerics to ``_``)."""
    domain, _, name = resource.partition("/")
    vendor = domain.split(".")[0]
    return re.sub(r"[^A-Z0-9]", "_", f"{vendor}_{name}".upper()) + "_VISIBLE_DEVICES"


_RESOLVED_KEPT = 1024  # resource names come from group specs: bounded, whatever tenants write


class EnvNames:
    """Resolves a resource name to the env vars that carry its device IDs."""

    def __init__(
        self,
        overrides: Mapping[str, Sequence[str]] | None = None,
        limits: Mapping[str, LimitEnvNames] | None = None,
    ) -> None:
        table: dict[str, tuple[str, ...]] = dict(DEFAULT_ENV_NAMES)
        for key, names in (overrides or {}).items():
            table[key] = _validated(key, names)
        self._table = table
        self._limits: dict[str, LimitEnvNames] = {**DEFAULT_LIMIT_ENV_NAMES, **(limits or {})}
        # Answers by resource: asked for every member's annotations and every pod's member rules, and the
        # tables never change after construction.
        self._resolved: dict[str, tuple[str, ...]] = {}
        self._resolved_limits: dict[str, LimitEnvNames | None] = {}

    def for_resource(self, resource: str) -> tuple[str, ...]:
        if "/" not in resource:  # a DeviceClass (CONTRACT §13): its devices reach containers through the claim
            return ()
        found = self._resolved.get(resource)
        if found is None:
            most = _most_specific(self._table, resource)
            found = most if most is not None else (fallback_env_name(resource),)
            if len(self._resolved) < _RESOLVED_KEPT:
                self._resolved[resource] = found
        return found

    def limits_for(self, resource: str) -> LimitEnvNames | None:
        """The env vars that carry a compute/memory share's limits for ``resource``, if any."""
        if resource in self._resolved_limits:
            return self._resolved_limits[resource]
        found = _most_specific(self._limits, resource)
        if len(self._resolved_limits) < _RESOLVED_KEPT:
            self._resolved_limits[resource] = found
        return found

    def for_group(self, spec: models.GroupSpec) -> list[str]:
        """Every env var a group's members get from the operator (and so must not set themselves):
        the visibility variables of its resources, then the limit and tile variables of its shares."""
        out: dict[str, None] = {}
        for resource in spec.resources:
            out.update(dict.fromkeys(self.for_resource(resource)))
        for resource, share in sorted(spec.share.items()):
            if share.tiles is not None:
                out[TILE_ENV_NAME] = None
                continue
            limits = self.limits_for(resource)
            if limits is None:
                continue
            if share.compute is not None and limits.compute:
                out[limits.compute] = None
            if share.memory is not None and limits.memory:
                out[limits.memory] = None
        return list(out)

    def for_resources(self, resources: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """resource -> env names, for each resource in order."""
        return {r: self.for_resource(r) for r in resources}

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self._table.items()}

    def limits_as_dict(self) -> dict[str, dict[str, str | None]]:
        return {
            k: {"compute": v.compute, "memory": v.memory, "memoryFormat": v.memory_format}
            for k, v in self._limits.items()
        }

    @classmethod
    def from_file(cls, path: str | Path) -> EnvNames:
        """Load overrides from a YAML or JSON file: ``{envNames: {KEY: [ENV, ...]}}`` or the bare map."""
        return cls.from_mapping(read_config_file(path), source=str(path))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "config") -> EnvNames:
        if data is None:
            return cls()
        limits: dict[str, LimitEnvNames] = {}
        if isinstance(data, Mapping) and _SECTIONS.intersection(data):
            limits = _limits(data.get("limitEnvNames") or {}, source)
            data = data.get("envNames") or {}
        if isinstance(data, str):  # a ConfigMap value holding JSON
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise EnvNameConfigError(f"{source}: envNames is not valid JSON: {e}") from e
        return cls(_plain(data, source), limits)


# The configuration file's sections; without any of them the file is the bare envNames map. The hand-over's
# own (CONTRACT §12) are read by deviceshare.api.handovers.
_SECTIONS = frozenset({"envNames", "limitEnvNames", "handover", "cdiKinds"})


def read_config_file(path: str | Path) -> Any:
    """The operator's configuration file (``--env-config``), YAML or JSON; empty is ``{}``."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise EnvNameConfigError(f"cannot read the env-name mapping {path} (--env-config): {e.strerror}") from e
    try:
        return yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise EnvNameConfigError(f"{path}: not valid YAML/JSON: {e}") from e


def _plain(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise EnvNameConfigError(f"{source}: envNames must be a mapping of resource -> env var names")
    return {str(k): v for k, v in data.items()}


def _most_specific(table: Mapping[str, _T], resource: str) -> _T | None:
    if resource in table:
        return table[resource]
    prefixes = [k for k in table if k.endswith("/") and resource.startswith(k)]
    return table[max(prefixes, key=len)] if prefixes else None


def _limits(data: Any, source: str) -> dict[str, LimitEnvNames]:
    """``{"nvidia.com/": "hami-core"}`` or ``{"nvidia.com/": {compute: X, memory: Y, memoryFormat: hami}}``."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise EnvNameConfigError(f"{source}: limitEnvNames is not valid JSON: {e}") from e
    if not isinstance(data, Mapping):
        raise EnvNameConfigError(f"{source}: limitEnvNames must be a mapping of resource -> limit env names")
    out: dict[str, LimitEnvNames] = {}
    for key, value in data.items():
        key = str(key)
        if not (key.endswith("/") or "/" in key):
            raise EnvNameConfigError(f"limit env-name key {key!r} must be a resource prefix or name")
        if isinstance(value, str):
            if value not in PRESETS:
                raise EnvNameConfigError(f"limit env names for {key!r}: {value!r} is none of {sorted(PRESETS)}")
            out[key] = PRESETS[value]
            continue
        if not isinstance(value, Mapping) or set(value) - {"compute", "memory", "memoryFormat"}:
            raise EnvNameConfigError(
                f"limit env names for {key!r} must be a preset name or {{compute, memory, memoryFormat}}"
            )
        names = {k: value.get(k) for k in ("compute", "memory")}
        for kind, n in names.items():
            if n is not None and (not isinstance(n, str) or not _ENV_NAME.match(n)):
                raise EnvNameConfigError(f"limit env names for {key!r}: {kind} {n!r} is not a valid env var name")
        fmt = value.get("memoryFormat", "mps")
        if fmt not in ("mps", "hami"):
            raise EnvNameConfigError(f"limit env names for {key!r}: memoryFormat must be mps or hami, got {fmt!r}")
        out[key] = LimitEnvNames(names["compute"], names["memory"], fmt)
    return out


def _validated(key: str, names: Any) -> tuple[str, ...]:
    if not (key.endswith("/") or "/" in key):
        raise EnvNameConfigError(
            f"env-name key {key!r} must be a resource prefix ending in '/' or a full resource name"
        )
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Sequence) or not names:
        raise EnvNameConfigError(f"env-name key {key!r} must map to a non-empty list of env var names")
    out = []
    for n in names:
        if not isinstance(n, str) or not _ENV_NAME.match(n):
            raise EnvNameConfigError(f"env-name key {key!r}: {n!r} is not a valid env var name")
        out.append(n)
    return tuple(dict.fromkeys(out))
