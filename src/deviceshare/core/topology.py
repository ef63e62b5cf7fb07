"""How a node's devices are linked to each other (CONTRACT §9), read from ``deviceshare.io/device-topology``.

The annotation names, for every pair of a resource's devices, the link ``nvidia-smi topo -m`` prints:
``NV#`` (a bonded set of # NVLinks), ``PIX`` (one PCIe switch), ``PXB`` (several PCIe switches, no host
bridge), ``PHB`` (a PCIe host bridge), ``NODE`` (host bridges within one NUMA node) or ``SYS`` (across
NUMA nodes / sockets). Placement ranks them in that order (:func:`link_class`): a set of devices is as
good as its worst link, then its links added up; more NVLinks beat fewer.

Parsing is cached by the annotation's text, so the thousands of nodes of one server model share one
:class:`Topology` object (and the device-choice cache keyed on it, :mod:`devicechoice`). Nothing here
raises on bad input: :func:`parse` returns what it could not read as an error text, which the node
reports as a problem (:mod:`inventory`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

NVLINK = re.compile(r"^NV([1-9][0-9]?)$")
PCIE_KINDS = ("PIX", "PXB", "PHB", "NODE", "SYS")
# Link classes, best first: NVLink, then the PCIe kinds in nvidia-smi's order. UNKNOWN: a pair the
# annotation does not describe (a device without an agent's word on it), worse than any known link.
NV_CLASS = 0
UNKNOWN = len(PCIE_KINDS) + 1
WHAT = {
    "PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge",
    "NODE": "one NUMA node", "SYS": "across sockets",
}


def link_class(link: str) -> int:
    """0 for NVLink, 1..5 for PIX..SYS, :data:`UNKNOWN` for anything else (lower is better)."""
    if link.startswith("NV") and NVLINK.match(link):
        return NV_CLASS
    try:
        return PCIE_KINDS.index(link) + 1
    except ValueError:
        return UNKNOWN


def nvlinks(link: str) -> int:
    """How many NVLinks ``NV#`` bonds; 0 for any other link."""
    match = NVLINK.match(link)
    return int(match.group(1)) if match else 0


def is_link(text: object) -> bool:
    return isinstance(text, str) and (bool(NVLINK.match(text)) or text in PCIE_KINDS)


Quality = tuple[int, int]  # (worst link class, sum of link classes) of a device set: smaller is better
PERFECT: Quality = (NV_CLASS, 0)  # every pair on NVLink (or one device: no pair at all)


@dataclass(frozen=True, slots=True, eq=False)
class Topology:
    """One resource's devices on one node: NUMA node per device and the link of every pair.

    Compared and hashed by identity: :func:`parse` hands out one object per annotation text.
    ``classes[i][j]`` and ``links_nv[i][j]`` are by position in ``devices`` (the annotation's order).
    """

    devices: tuple[str, ...]
    numa: Mapping[str, int]
    classes: tuple[tuple[int, ...], ...]
    links_nv: tuple[tuple[int, ...], ...]
    names: tuple[tuple[str, ...], ...]  # the link as the annotation wrote it ("" on the diagonal)
    position: Mapping[str, int] = field(default_factory=dict)

    def link(self, a: str, b: str) -> str:
        """The link between two devices as the node reported it; "" when it did not."""
        i, j = self.position.get(a), self.position.get(b)
        if i is None or j is None or i == j:
            return ""
        return self.names[i][j]

    def quality(self, ids: Sequence[str]) -> Quality:
        """(worst link class, sum of link classes) over every pair of ``ids``; unknown pairs count worst."""
        pos = [self.position.get(d, -1) for d in ids]
        worst = total = 0
        for x in range(len(pos)):
            for y in range(x + 1, len(pos)):
                i, j = pos[x], pos[y]
                c = UNKNOWN if i < 0 or j < 0 else self.classes[i][j]
                total += c
                if c > worst:
                    worst = c
        return worst, total


def describe(topology: Topology | None, ids: Sequence[str]) -> str:
    """The links among ``ids`` in a few words: ``NV12``, ``NV4 to SYS``, ``PIX``; "" for one device or no topology."""
    if topology is None or len(ids) < 2:
        return ""
    links = [topology.link(a, b) or "?" for i, a in enumerate(ids) for b in ids[i + 1:]]
    order = sorted(set(links), key=lambda x: (link_class(x), -nvlinks(x), x))
    return order[0] if len(order) == 1 else f"{order[0]} to {order[-1]}"


def describe_worst(link: str) -> str:
    """``SYS (across sockets)``, ``NV12 (NVLink)``: a link kind with what it means."""
    if NVLINK.match(link):
        return f"{link} (NVLink)"
    return f"{link} ({WHAT[link]})" if link in WHAT else link


@functools.lru_cache(maxsize=1024)
def parse(raw: str) -> tuple[Mapping[str, Topology], str]:
    """The annotation's topologies by resource, or an error text naming what is wrong ("" if none)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return {}, f"is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return {}, "must be a JSON object of resource -> {device ID -> {\"numa\": n, \"links\": {...}}}"
    out: dict[str, Topology] = {}
    for resource, per_device in sorted(data.items()):
        topology, error = _one(resource, per_device)
        if error:
            return {}, error
        assert topology is not None
        out[resource] = topology
    return out, ""


def _one(resource: str, per_device: object) -> tuple[Topology | None, str]:
    if not isinstance(per_device, dict) or not all(isinstance(d, str) and d for d in per_device):
        return None, f"[{resource}] must map device IDs to {{\"numa\": n, \"links\": {{other ID: link}}}}"
    devices = tuple(per_device)
    numa: dict[str, int] = {}
    named: dict[tuple[str, str], str] = {}
    for device, facts in per_device.items():
        if not isinstance(facts, dict):
            return None, f"[{resource}][{device}] must be an object with \"numa\" and \"links\""
        node = facts.get("numa", -1)
        if not isinstance(node, int) or isinstance(node, bool):
            return None, f"[{resource}][{device}].numa must be an integer, got {node!r}"
        numa[device] = node
        links = facts.get("links", {})
        if not isinstance(links, dict):
            return None, f"[{resource}][{device}].links must be an object of device ID -> link"
        for other, link in links.items():
            if other not in per_device or other == device:
                return None, f"[{resource}][{device}].links names {other!r}, which is no other device listed"
            if not is_link(link):
                return None, (f"[{resource}][{device}].links[{other}] is {link!r}; a link is NV<n>, "
                              f"{', '.join(PCIE_KINDS)} (as nvidia-smi topo -m prints them)")
            back = named.get((other, device))
            if back is not None and back != link:
                return None, f"[{resource}] says {device}-{other} is {link} one way and {back} the other"
            named[(device, other)] = link
    return _built(devices, numa, named), ""


def _built(devices: tuple[str, ...], numa: Mapping[str, int], named: Mapping[tuple[str, str], str]) -> Topology:
    def name(a: str, b: str) -> str:
        return "" if a == b else named.get((a, b)) or named.get((b, a)) or ""

    names = tuple(tuple(name(a, b) for b in devices) for a in devices)
    classes = tuple(
        tuple(NV_CLASS if i == j else (link_class(n) if n else UNKNOWN) for j, n in enumerate(row))
        for i, row in enumerate(names)
    )
    links_nv = tuple(tuple(nvlinks(n) for n in row) for row in names)
    return Topology(devices, dict(numa), classes, links_nv, names, {d: i for i, d in enumerate(devices)})


def from_links(
    devices: Sequence[str], link: Mapping[tuple[str, str], str], numa: Mapping[str, int] | None = None
) -> Topology:
    """A topology built directly (tests, benchmarks, the node agent's own check of what it publishes)."""
    return _built(tuple(devices), dict(numa or {}), dict(link))


def annotation(topologies: Mapping[str, Topology]) -> str:
    """The annotation text for ``topologies`` (deterministic: same facts, same text)."""
    body = {
        resource: {
            d: {"numa": t.numa.get(d, -1),
                "links": {o: t.link(d, o) for o in t.devices if o != d and t.link(d, o)}}
            for d in t.devices
        }
        for resource, t in sorted(topologies.items())
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def numa_of(topology: Topology | None, ids: Iterable[str]) -> tuple[int, ...]:
    """The NUMA nodes of ``ids`` (sorted, once each; -1 where unknown)."""
    if topology is None:
        return ()
    return tuple(sorted({topology.numa.get(d, -1) for d in ids}))
