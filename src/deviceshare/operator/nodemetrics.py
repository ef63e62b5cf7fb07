"""Per-node device gauges (free, allocated, compute, memory, tiles per node and resource), as exposition text
kept per node from the ledger's changes.

At 5,000 nodes these are ~30,000 samples: building them from the ledger and formatting them through
prometheus-client took ~190 ms a scrape, all of it on the operator's event loop. A node's lines change
only when the ledger changes that node, so they are kept as text per node: the ledger's subscription marks
a node changed, a scrape re-renders the changed nodes only and joins the rest. A scrape is then a join of
O(nodes x resources) strings, plus O(devices) for each node changed since the last one.

With sharing (CONTRACT §7) a device may be partly given out, so the compute (in devices, a whole-held
device counting 1) and the device memory (bytes, where the node declares it) handed out per node and
resource are exported beside the device counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from deviceshare.core import capacity
from deviceshare.core.snapshots import ChangedNodes

if TYPE_CHECKING:
    from deviceshare.core.inventory import NodeInfo
    from deviceshare.core.ledger import DeviceLedger

FREE, ALLOCATED, COMPUTE, MEMORY, MEMORY_CAP, TILES, UNHEALTHY = range(7)
FAMILIES = (  # (name, help), in the order above
    ("deviceshare_devices_free", "Devices no group holds"),
    ("deviceshare_devices_allocated", "Devices held by a group"),
    ("deviceshare_compute_allocated",
     "Device compute given out, in devices (a whole-held device counts 1, a 460m share 0.46)"),
    ("deviceshare_device_memory_allocated_bytes",
     "Device memory given out (whole-held devices count their declared memory)"),
    ("deviceshare_device_memory_bytes", "Device memory the node declares, over its devices"),
    ("deviceshare_tiles_allocated", "Device tiles held by groups"),
    ("deviceshare_devices_unhealthy", "Devices the node reports unhealthy (deviceshare.io/device-health)"),
)  # fmt: skip
_number: Callable[[float], str] = floatToGoString  # prometheus-client's own number format ("8.0", "+Inf")
_HEADERS = tuple(f"# HELP {name} {doc}\n# TYPE {name} gauge\n" for name, doc in FAMILIES)


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class NodeGauges:
    """The per-node families of one ledger (the latest a rebuild made), rendered lazily per changed node."""

    def __init__(self, active: Callable[[], bool] = lambda: True) -> None:
        self.ledger: DeviceLedger | None = None
        self.active = active  # False on a standby: its ledger is as old as its last term as leader
        self._changed = ChangedNodes()  # filled by the ledger as nodes change, taken when rendered
        self._lines: dict[str, tuple[str, ...]] = {}  # node -> its text per family
        self._order: list[str] | None = []  # node names sorted; None when a node came or went

    def bind(self, ledger: DeviceLedger) -> None:
        if ledger is self.ledger:
            return
        self.ledger, self._changed, self._lines, self._order = ledger, ChangedNodes(), {}, None
        ledger.subscribe(self._changed)

    def text(self) -> str:
        ledger = self.ledger
        if ledger is None or not self.active():
            return "".join(_HEADERS)
        changed = self._changed.take()
        for name in changed:
            info = ledger.node(name)
            if info is None:
                self._order = None if self._lines.pop(name, None) is not None else self._order
                continue
            if name not in self._lines:
                self._order = None
            self._lines[name] = self._render(ledger, info)
        if self._order is None:
            self._order = sorted(self._lines)
        lines = [self._lines[name] for name in self._order]
        return "".join(_HEADERS[f] + "".join(node[f] for node in lines) for f in range(len(FAMILIES)))

    @staticmethod
    def _render(ledger: DeviceLedger, node: NodeInfo) -> tuple[str, ...]:
        out: list[list[str]] = [[] for _ in FAMILIES]
        for resource, ids in node.devices.items():
            labels = f'{{node="{_label(node.name)}",resource="{_label(resource)}"}} '
            n_free = len(ledger.free_devices(node.name, resource))
            milli, mem, n_tiles = given_out(ledger, node, resource, ids)
            # An unhealthy device nobody holds is neither free nor allocated (CONTRACT §9).
            sick = [d for d in ids if d in node.unhealthy.get(resource, ())]
            idle_sick = sum(1 for d in sick if ledger.holder(node.name, resource, d) is None)
            values: list[tuple[int, float]] = [
                (FREE, n_free), (ALLOCATED, len(ids) - n_free - idle_sick), (COMPUTE, milli / 1000),
                (UNHEALTHY, len(sick)),
            ]
            per_device = node.device_memory.get(resource)
            if per_device is not None:
                values += [(MEMORY, mem), (MEMORY_CAP, per_device * len(ids))]
            if node.device_tiles.get(resource):
                values.append((TILES, n_tiles))
            for family, value in values:
                out[family].append(f"{FAMILIES[family][0]}{labels}{_number(value)}\n")
        return tuple("".join(lines) for lines in out)


def given_out(ledger: DeviceLedger, node: NodeInfo, resource: str, ids: Sequence[str]) -> tuple[int, int, int]:
    """(compute milli, memory bytes, tiles) held on the node's devices of ``resource``."""
    per_device = node.device_memory.get(resource, 0)
    milli = mem = tiles = 0
    for device in ids:
        use = ledger.use(node.name, resource, device)
        if use is not None:
            milli, mem, tiles = milli + use.compute_milli, mem + use.memory_bytes, tiles + len(use.tiles)
        elif ledger.holder(node.name, resource, device) is not None:
            milli, mem = milli + capacity.COMPUTE_FULL, mem + per_device
    return milli, mem, tiles
