"""How a bound pod's containers are handed its group's devices (CONTRACT §12): one seam, one implementation per way.

The scheduling phases decide *which* devices a group holds; a hand-over turns that decision into what the pod
carries in the Binding that places it. Two ways today, chosen per node:

- :class:`EnvHandover`: nothing beyond the ``deviceshare.io/env.*`` annotations (CONTRACT §3), which every member
  carries whatever its node: the webhook's downward-API env vars read them, and a toolkit that accepts
  ``NVIDIA_VISIBLE_DEVICES`` from unprivileged containers hands over the devices they name.
- :class:`CdiHandover`: ``nvidia.cdi.k8s.io/container.<name>: <kind>=<id>,...`` for every container and init
  container, the annotation NVIDIA's container toolkit NRI plugin reads at CreateContainer
  (``cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go``), so nodes that refuse the env var still get
  exactly the group's devices.

A further way (a DRA claim) is another implementation of :class:`Handover`, chosen by :meth:`Handovers.for_node`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

from deviceshare import errors
from deviceshare.api import envnames, names

HandoverName = Literal["env", "cdi"]
HANDOVER_NAMES: Final[tuple[HandoverName, ...]] = ("env", "cdi")
DEFAULT_CDI_KINDS: Final[Mapping[str, str]] = MappingProxyType({names.NVIDIA_GPU_RESOURCE: "nvidia.com/gpu"})


class HandoverConfigError(errors.ConfigError, ValueError):
    """A hand-over setting given by an admin (flag or configuration file) is malformed."""


class Handover(Protocol):
    """Turns a group's devices into the annotations a member carries in its Binding, beside CONTRACT §3's."""

    @property
    def name(self) -> HandoverName: ...

    def pod_annotations(self, devices: Mapping[str, Sequence[str]], containers: Sequence[str]) -> dict[str, str]:
        """``devices``: resource -> IDs in the group's order; ``containers``: every init container and container."""
        ...


@dataclass(frozen=True, slots=True)
class EnvHandover:
    @property
    def name(self) -> HandoverName:
        return "env"

    def pod_annotations(self, devices: Mapping[str, Sequence[str]], containers: Sequence[str]) -> dict[str, str]:
        return {}  # the deviceshare.io/env.* annotations, written on every node, are this hand-over


@dataclass(frozen=True, slots=True)
class CdiHandover:
    kinds: Mapping[str, str]  # resource -> CDI kind; a resource without one keeps the env hand-over only

    @property
    def name(self) -> HandoverName:
        return "cdi"

    def device_names(self, devices: Mapping[str, Sequence[str]]) -> list[str]:
        """Fully qualified CDI names, resources in name order and IDs in the group's order (§7's ordinals)."""
        return [f"{kind}={i}" for resource, ids in sorted(devices.items())
                if (kind := self.kinds.get(resource)) for i in ids]

    def pod_annotations(self, devices: Mapping[str, Sequence[str]], containers: Sequence[str]) -> dict[str, str]:
        value = ",".join(self.device_names(devices))
        if not value:
            return {}
        return {cdi_annotation(c): value for c in containers}


def cdi_annotation(container: str) -> str:
    return names.CDI_CONTAINER_ANNOTATION_PREFIX + container


@dataclass(frozen=True, slots=True)
class Handovers:
    """Which hand-over each node gets: its ``deviceshare.io/handover`` label, else ``default``."""

    default: HandoverName = "env"
    cdi_kinds: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CDI_KINDS))

    def named(self, name: HandoverName) -> Handover:
        return CdiHandover(self.cdi_kinds) if name == "cdi" else EnvHandover()

    def choice(self, labels: Mapping[str, str] | None) -> HandoverName:
        """The node's label when it names a hand-over, else the default (an unknown value counts as none)."""
        label = (labels or {}).get(names.NODE_HANDOVER_LABEL)
        return label if label in HANDOVER_NAMES else self.default

    def for_node(self, labels: Mapping[str, str] | None) -> Handover:
        return self.named(self.choice(labels))

    def with_overrides(self, default: str | None, cdi_kinds: Iterable[str]) -> Handovers:
        """Command-line flags over this (the configuration file's) setting: ``--handover``, ``--cdi-kind``s."""
        kinds = dict(self.cdi_kinds)
        kinds.update(parse_cdi_kinds(cdi_kinds, source="--cdi-kind"))
        return Handovers(_handover_name(default, "--handover") if default else self.default, kinds)

    @classmethod
    def from_file(cls, path: str) -> Handovers:
        return cls.from_mapping(envnames.read_config_file(path), source=path)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "config") -> Handovers:
        """``handover: cdi|env`` and ``cdiKinds: {RESOURCE: KIND}`` of the configuration file (both optional)."""
        if not isinstance(data, Mapping):
            return cls()
        default = data.get("handover")
        kinds = data.get("cdiKinds") or {}
        if not isinstance(kinds, Mapping):
            raise HandoverConfigError(f"{source}: cdiKinds must be a mapping of resource -> CDI kind")
        merged = dict(DEFAULT_CDI_KINDS)
        merged.update(parse_cdi_kinds((f"{k}={v}" for k, v in kinds.items()), source=f"{source}: cdiKinds"))
        return cls(_handover_name(default, f"{source}: handover") if default is not None else "env", merged)


def parse_cdi_kinds(entries: Iterable[str], *, source: str) -> dict[str, str]:
    """``RESOURCE=KIND`` entries (``nvidia.com/gpu=nvidia.com/gpu``); a kind is ``vendor.tld/class`` as CDI names it."""
    out: dict[str, str] = {}
    for entry in entries:
        resource, sep, kind = str(entry).partition("=")
        if not sep or not envnames.is_device_resource(resource):
            raise HandoverConfigError(f"{source} {entry!r}: expected RESOURCE=KIND, e.g. nvidia.com/gpu=nvidia.com/gpu")
        if not envnames.is_device_resource(kind):
            raise HandoverConfigError(f"{source} {entry!r}: the CDI kind {kind!r} is not vendor.tld/class")
        out[resource] = kind
    return out


def _handover_name(value: object, source: str) -> HandoverName:
    if value not in HANDOVER_NAMES:
        raise HandoverConfigError(f"{source}: {value!r} is no hand-over; expected one of {', '.join(HANDOVER_NAMES)}")
    return value


def carried(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The CDI hand-over a pod carries: container -> CDI device names (empty: the env hand-over)."""
    prefix = names.CDI_CONTAINER_ANNOTATION_PREFIX
    return {k[len(prefix):]: v for k, v in sorted((annotations or {}).items()) if k.startswith(prefix)}


def describe(annotations: Mapping[str, str] | None) -> str:
    """``cdi nvidia.com/gpu=0,nvidia.com/gpu=1`` or ``env`` (what demo, inspect and explain print)."""
    values = sorted(set(carried(annotations).values()))
    return "cdi " + "; ".join(values) if values else "env"
