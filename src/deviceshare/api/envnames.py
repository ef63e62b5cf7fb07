"""Which env var(s) make a device resource visible inside a container (CONTRACT §4).

The defaults follow each vendor's container runtime. Admins can override or extend them with a
mapping whose keys are either a resource prefix ending in ``/`` (``nvidia.com/``) or an exact
resource name (``example.com/fpga``); the most specific key wins. The webhook (which wires the
env vars) and the operator (which writes their values) must agree, so both read this one module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from deviceshare import errors

DEFAULT_ENV_NAMES: Mapping[str, tuple[str, ...]] = {
    "nvidia.com/": ("NVIDIA_VISIBLE_DEVICES",),
    "amd.com/": ("AMD_VISIBLE_DEVICES",),
    "huawei.com/": ("ASCEND_VISIBLE_DEVICES",),
    "gpu.intel.com/": ("ZE_AFFINITY_MASK",),
    "habana.ai/": ("HABANA_VISIBLE_DEVICES",),
}

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


class EnvNames:
    """Resolves a resource name to the env vars that carry its device IDs."""

    def __init__(self, overrides: Mapping[str, Sequence[str]] | None = None) -> None:
        table: dict[str, tuple[str, ...]] = dict(DEFAULT_ENV_NAMES)
        for key, names in (overrides or {}).items():
            table[key] = _validated(key, names)
        self._table = table

    def for_resource(self, resource: str) -> tuple[str, ...]:
        if resource in self._table:
            return self._table[resource]
        prefixes = [k for k in self._table if k.endswith("/") and resource.startswith(k)]
        if prefixes:
            return self._table[max(prefixes, key=len)]
        return (fallback_env_name(resource),)

    def for_resources(self, resources: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """resource -> env names, for each resource in order."""
        return {r: self.for_resource(r) for r in resources}

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self._table.items()}

    @classmethod
    def from_file(cls, path: str | Path) -> EnvNames:
        """Load overrides from a YAML or JSON file: ``{envNames: {KEY: [ENV, ...]}}`` or the bare map."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise EnvNameConfigError(f"cannot read the env-name mapping {path} (--env-config): {e.strerror}") from e
        try:
            data: Any = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as e:
            raise EnvNameConfigError(f"{path}: not valid YAML/JSON: {e}") from e
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "config") -> EnvNames:
        if data is None:
            return cls()
        if isinstance(data, Mapping) and "envNames" in data:
            data = data["envNames"]
        if isinstance(data, str):  # a ConfigMap value holding JSON
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise EnvNameConfigError(f"{source}: envNames is not valid JSON: {e}") from e
        if not isinstance(data, Mapping):
            raise EnvNameConfigError(f"{source}: envNames must be a mapping of resource -> env var names")
        return cls({str(k): v for k, v in data.items()})


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
