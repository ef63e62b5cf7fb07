"""pydantic models of the SharedDeviceGroup spec and status.

They mirror ``crds/shareddevicegroups.yaml`` (a test compares the two field by field), so what the
API server accepts and what the operator and webhook parse are the same thing. Field names are
snake_case in Python and camelCase on the wire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from deviceshare.api import names, quantities

MAX_RESOURCES = 16
MAX_DEVICES_PER_RESOURCE = 64
MAX_MEMBERS_LIMIT = 10_000
MAX_SELECTOR_ENTRIES = 64
MAX_LABEL_VALUE_LENGTH = 63
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"

MAX_TILES_PER_DEVICE = 64
# A device's compute share in (0, 1], as a string: 1m..1000m, a decimal with at most three places
# (0.5, .25, 0.001), or 1. Thousandths are the resolution: MPS takes a whole percentage anyway.
COMPUTE_PATTERN = r"^(([1-9][0-9]{0,2}|1000)m|0?\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9])|1(\.0{0,3})?)$"
# Device memory, positive, in bytes or with a binary/decimal multiple (12Gi, 12288Mi, 1.5Gi, 16G).
MEMORY_PATTERN = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
)

# DRA groups (CONTRACT §13). Limits as resource.k8s.io/v1 states them (pkg/apis/resource/types.go):
# DeviceClass names are DNS subdomains; a request allocates at most 32 devices (AllocationResultsMaxSize);
# at most 32 selectors (DeviceSelectorsMaxSize), each CEL expression at most 10 Ki bytes
# (CELSelectorExpressionMaxLength); capacity names are QualifiedNames (a C identifier of at most 32, with an
# optional DNS-subdomain domain), at most 32 per device (MaxAttributesAndCapacitiesPerDevice).
MAX_CLAIM_DEVICES = 32
MAX_CLAIM_SELECTORS = 32
MAX_CEL_SELECTOR_LENGTH = 10 * 1024
MAX_CAPACITY_REQUESTS = 32
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CAPACITY_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}$"
)
# A positive resource.Quantity as a capacity request is written (24Gi, 500m, 2): the memory pattern plus milli.
CAPACITY_PATTERN = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)

Strategy = Literal["binpack", "spread", "fgd"]
Phase = Literal["Pending", "Bound", "Releasing"]
ConditionStatus = Literal["True", "False", "Unknown"]
DeviceCount = Annotated[int, Field(ge=1, le=MAX_DEVICES_PER_RESOURCE)]
ResourceName = Annotated[str, StringConstraints(pattern=RESOURCE_NAME_PATTERN, max_length=253)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE_LENGTH)]
# int-or-string quantities, as the CRD declares them (x-kubernetes-int-or-string): the integer 1, or
# a string matching the pattern. A YAML float (0.5) is neither; write "0.5" or 500m.
ComputeQuantity = (
    Annotated[StrictInt, Field(ge=1, le=1)] | Annotated[str, StringConstraints(pattern=COMPUTE_PATTERN)]
)
MemoryQuantity = Annotated[StrictInt, Field(ge=1)] | Annotated[str, StringConstraints(pattern=MEMORY_PATTERN)]
CapacityQuantity = (
    Annotated[StrictInt, Field(ge=1)] | Annotated[str, StringConstraints(pattern=CAPACITY_PATTERN)]
)
CapacityName = Annotated[str, StringConstraints(pattern=CAPACITY_NAME_PATTERN, max_length=63 + 1 + 32)]
DeviceClassName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
CelSelector = Annotated[str, StringConstraints(min_length=1, max_length=MAX_CEL_SELECTOR_LENGTH)]
# RFC 3339 as metav1.Time writes it; the CRD declares `format: date-time`.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


CLAIM_SHARE_IS_CAPACITY = (
    "a claim group's share takes capacity requests alone (capacity: {memory: 24Gi}), not compute, memory or tiles"
)
CAPACITY_IS_FOR_CLAIMS = (
    "share capacity is for a claim group (spec.claim); spec.resources shares take compute, memory or tiles"
)


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, no unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class DeviceShare(_Model):
    """The part of each device of one resource a sharing group takes (CONTRACT §7).

    Either ``compute`` and/or ``memory`` (other sharers may use the rest), or ``tiles`` alone
    (whole sub-devices), or, for a DRA group (CONTRACT §13), ``capacity`` alone: the capacity requests of
    the group's ResourceClaim, named as the driver's slices publish them (``{memory: 24Gi}``). The wire
    keeps the quantities as written; ``compute_milli`` and ``memory_bytes`` are the numbers the ledger
    counts in.
    """

    model_config = ConfigDict(extra="forbid")

    compute: ComputeQuantity | None = None
    memory: MemoryQuantity | None = None
    tiles: int | None = Field(default=None, ge=1, le=MAX_TILES_PER_DEVICE)
    capacity: dict[CapacityName, CapacityQuantity] | None = Field(
        default=None, min_length=1, max_length=MAX_CAPACITY_REQUESTS
    )

    @model_validator(mode="after")
    def _one_kind(self) -> DeviceShare:
        beside = self.compute is not None or self.memory is not None or self.tiles is not None
        if self.capacity is not None and beside:
            raise ValueError("capacity stands alone in a share entry: no compute, memory or tiles beside it")
        if self.tiles is not None and (self.compute is not None or self.memory is not None):
            raise ValueError("tiles stands alone in a share entry: no compute or memory beside it")
        if self.capacity is None and not beside:
            raise ValueError("a share entry needs compute, memory or both (or tiles alone, or capacity alone)")
        return self

    @property
    def compute_milli(self) -> int:
        """Thousandths of the device's compute; 0 when not asked."""
        return 0 if self.compute is None else quantities.parse_milli(self.compute)

    @property
    def memory_bytes(self) -> int:
        """Bytes of device memory; 0 when not asked."""
        return 0 if self.memory is None else quantities.parse_bytes(self.memory)

    def describe(self) -> str:
        """``compute=460m,memory=12Gi``, ``tiles=1`` or ``capacity.memory=24Gi``, for messages."""
        if self.capacity is not None:
            return ",".join(f"capacity.{name}={value}" for name, value in sorted(self.capacity.items()))
        if self.tiles is not None:
            return f"tiles={self.tiles}"
        parts = []
        if self.compute is not None:
            parts.append(f"compute={self.compute}")
        if self.memory is not None:
            parts.append(f"memory={self.memory}")
        return ",".join(parts)


class DeviceClaim(_Model):
    """The devices a DRA group takes through its ResourceClaim (CONTRACT §13): ``count`` devices of a
    DeviceClass, each matching every CEL selector. The operator writes it into the claim's one request as
    ``exactly: {deviceClassName, count, selectors: [{cel: {expression}}]}``."""

    model_config = ConfigDict(extra="forbid")

    device_class_name: DeviceClassName
    count: int = Field(default=1, ge=1, le=MAX_CLAIM_DEVICES)
    selectors: list[CelSelector] = Field(default_factory=list, max_length=MAX_CLAIM_SELECTORS)


class GroupSpec(_Model):
    """What a group asks for: whole devices or shares of extended resources (``resources``), or the devices
    of a ResourceClaim (``claim``), exactly one of the two. ``resources``, ``claim``, ``share``,
    ``nodeSelector`` and ``minMembers`` are immutable once Bound."""

    model_config = ConfigDict(extra="forbid")

    resources: dict[ResourceName, DeviceCount] = Field(
        default_factory=dict, min_length=1, max_length=MAX_RESOURCES
    )
    claim: DeviceClaim | None = None
    share: dict[str, DeviceShare] = Field(default_factory=dict, max_length=MAX_RESOURCES)
    node_selector: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_SELECTOR_ENTRIES)
    scheduling_strategy: Strategy = "binpack"
    max_members: int = Field(default=0, ge=0, le=MAX_MEMBERS_LIMIT)
    # Gang start (CONTRACT §8): 0 = no gang; N = bind nobody until N members exist and fit one node.
    min_members: int = Field(default=0, ge=0, le=MAX_MEMBERS_LIMIT)

    @field_validator("resources")
    @classmethod
    def _ordered(cls, v: dict[str, int]) -> dict[str, int]:
        return dict(sorted(v.items()))

    @model_validator(mode="after")
    def _resources_or_claim(self) -> GroupSpec:
        if bool(self.resources) == (self.claim is not None):
            raise ValueError("exactly one of spec.claim and spec.resources must be set")
        return self

    @model_validator(mode="after")
    def _share_keys_are_resources(self) -> GroupSpec:
        if self.claim is not None:
            unknown = sorted(set(self.share) - {self.claim.device_class_name})
            if unknown:
                raise ValueError(
                    f"spec.share names {unknown}: a claim group's share key is spec.claim.deviceClassName "
                    f"({self.claim.device_class_name})"
                )
            if any(entry.capacity is None for entry in self.share.values()):
                raise ValueError(CLAIM_SHARE_IS_CAPACITY)
            return self
        unknown = sorted(set(self.share) - set(self.resources))
        if unknown:
            raise ValueError(f"spec.share names {unknown}, which spec.resources does not list")
        if any(entry.capacity is not None for entry in self.share.values()):
            raise ValueError(CAPACITY_IS_FOR_CLAIMS)
        return self

    @model_validator(mode="after")
    def _gang_fits_the_group(self) -> GroupSpec:
        if self.max_members and self.min_members > self.max_members:
            raise ValueError(
                f"spec.minMembers ({self.min_members}) must not exceed spec.maxMembers ({self.max_members})"
            )
        return self

    @property
    def shares(self) -> dict[str, DeviceShare]:
        """resource -> share, for the resources shared with other groups (empty: whole devices)."""
        return dict(sorted(self.share.items()))

    @property
    def is_dra(self) -> bool:
        """Whether the group takes its devices through a ResourceClaim (CONTRACT §13)."""
        return self.claim is not None

    @property
    def requested(self) -> dict[str, int]:
        """What the group asks for, keyed as its allocation is: resource -> whole devices, or for a claim
        group ``{deviceClassName: count}``."""
        if self.claim is not None:
            return {self.claim.device_class_name: self.claim.count}
        return dict(self.resources)


class Condition(_Model):
    """A metav1.Condition."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None

    @field_validator("last_transition_time")
    @classmethod
    def _rfc3339(cls, v: str | None) -> str | None:
        if v is not None and not _RFC3339.match(v):
            raise ValueError(f"lastTransitionTime must be an RFC 3339 date-time, got {v!r}")
        return v


class GroupStatus(_Model):
    phase: Phase = "Pending"
    node_name: str | None = None
    nominated_node_name: str | None = None  # preemption under way there for this group (CONTRACT §8)
    allocated_devices: dict[str, list[str]] = Field(default_factory=dict)
    allocated_tiles: dict[str, list[str]] = Field(default_factory=dict)  # resource -> "<device>.<tile>"
    members: list[str] = Field(default_factory=list)
    member_count: int = Field(default=0, ge=0)
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @classmethod
    def from_k8s(cls, raw: Mapping[str, Any] | None) -> GroupStatus:
        """Our fields of a status; other writers' fields (Kopf's bookkeeping) are ignored."""
        known = {f.alias or k for k, f in cls.model_fields.items()}
        return cls.model_validate({k: v for k, v in (raw or {}).items() if k in known})


class SharedDeviceGroup(_Model):
    """A whole object as read from the API (metadata kept as a plain mapping)."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = names.API_VERSION
    kind: str = names.KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GroupSpec
    status: GroupStatus = Field(default_factory=GroupStatus)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", ""))

    @classmethod
    def from_k8s(cls, body: Mapping[str, Any]) -> SharedDeviceGroup:
        return cls.model_validate({**body, "status": GroupStatus.from_k8s(body.get("status"))})
