"""The on-call engineer's first questions as metrics: is there a leader, how many groups in each phase, why
groups wait, how fragmented each resource is, how long groups took to be Bound.

Everything here is read from counts kept as the operator's state changes (:class:`~.tallies.Tally` over the
groups and the unschedulable reasons, the ledger's subscription for fragmentation), so a scrape costs the
number of classes (phases, reason kinds, resources), never a walk over groups, pods or nodes.

A replica that does not schedule (a standby) knows nothing current: it exports ``deviceshare_leader 0``
and none of the fleet series, so a sum over replicas counts the leader's alone. Labels are bounded:
phase, reason kind, resource; never a group's or a pod's name.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, cast

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from deviceshare.core import fgdplacement, fleetfragmentation, reasonkinds
from deviceshare.core import ledger as ledgers

from . import state as state_
from . import tallies
from .state import GroupKey, GroupRecord

PHASES = ("Pending", "Bound", "Releasing")
# Waits run from sub-second (a free node) to hours (a big group on a busy cluster).
TIME_TO_BOUND_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)


class FleetSource(Protocol):
    """What the collector reads (a :class:`~.context.Context` is one; its properties follow each rebuild)."""

    @property
    def state(self) -> state_.ClusterState: ...
    @property
    def unschedulable(self) -> tallies.Tally[GroupKey, str]: ...
    @property
    def fgd(self) -> fgdplacement.FGDPlacement: ...
    @property
    def conflicts(self) -> Mapping[GroupKey, set[GroupKey]]: ...


WaitingClass = tuple[str, tuple[tuple[str, int], ...]]  # (reason kind, what a group short of devices asks)


def waiting_class(message: str, group: GroupRecord | None) -> WaitingClass:
    """The class an unschedulable group is counted in: its reason kind, and for want of devices what it asks
    (resource, devices), so the largest request per resource is known without a walk."""
    kind = reasonkinds.kind_of(message)
    if kind != reasonkinds.DEVICES or group is None or group.spec is None:
        return (kind, ())
    return (kind, tuple(sorted(group.spec.resources.items())))


def time_to_bound(old: GroupRecord | None, new: GroupRecord | None, now: float) -> float | None:
    """Seconds from a group's creation to now, when this change takes it from Pending to Bound."""
    if old is None or new is None or old.uid != new.uid:
        return None
    if old.status.phase != "Pending" or new.status.phase != "Bound" or not new.created:
        return None
    try:
        created = datetime.datetime.fromisoformat(new.created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return max(0.0, now - created)


class FleetCollector(Collector):
    """Leader, groups per phase, unschedulable groups per reason kind, fragmentation per resource."""

    def __init__(self) -> None:
        # Groups holding a device their node reports unhealthy, as the reconciler last found (CONTRACT §9).
        self.on_unhealthy: set[GroupKey] = set()
        self.source: FleetSource | None = None
        self.leading: Callable[[], bool] | None = None  # None: no election here (a bare context in a test)
        self._fragmentation = fleetfragmentation.FleetFragmentation()
        self._tracked: ledgers.DeviceLedger | None = None

    def track(self, ledger: ledgers.DeviceLedger) -> None:
        """Follow ``ledger`` (a rebuild's new one): told every node once, then each change."""
        if ledger is not self._tracked:
            self._tracked, self._fragmentation = ledger, fleetfragmentation.FleetFragmentation()
            ledger.subscribe(self._fragmentation.node_changed)

    @property
    def active(self) -> bool:
        return self.source is not None and (self.leading is None or self.leading())

    def collect(self) -> Iterator[Metric]:
        leader = GaugeMetricFamily(
            "deviceshare_leader", "1 while this replica schedules (holds the Lease and has rebuilt), else 0"
        )
        leader.add_metric([], 1.0 if self.leading is not None and self.leading() else 0.0)
        yield leader
        source = self.source
        if source is None or not self.active:
            return
        yield _counts("deviceshare_groups", "SharedDeviceGroups by status.phase", "phase",
                      PHASES, source.state.groups.counts)  # fmt: skip
        contested = GaugeMetricFamily(
            "deviceshare_groups_in_conflict",
            "Groups whose devices another group also claims (found at a rebuild; nobody new gets them until released)",
        )
        contested.add_metric([], float(len(source.conflicts)))
        yield contested
        ill = GaugeMetricFamily(
            "deviceshare_groups_on_unhealthy_devices", "Groups holding a device their node reports unhealthy"
        )
        ill.add_metric([], float(len(self.on_unhealthy)))
        yield ill
        waiting = source.unschedulable.counts
        by_kind: dict[str, int] = {}
        largest: dict[str, int] = {}
        for klass, count in waiting.items():
            kind, asks = cast(WaitingClass, klass)
            by_kind[kind] = by_kind.get(kind, 0) + count
            for resource, devices in asks:
                largest[resource] = max(largest.get(resource, 0), devices)
        yield _counts("deviceshare_unschedulable_groups",
                      "Pending groups the last placement found no node for, by the kind of reason that rejected the "
                      "most nodes", "reason", reasonkinds.KINDS, by_kind)  # fmt: skip
        asked = GaugeMetricFamily(
            "deviceshare_unschedulable_group_devices_max",
            "The most devices of the resource one group asks for among those waiting for want of devices",
            labels=["resource"],
        )
        for resource in sorted(largest):
            asked.add_metric([resource], largest[resource])
        yield asked
        rates = GaugeMetricFamily(
            "deviceshare_fragmentation",
            "Share of the open nodes' idle device compute the expected workload cannot use (FGD's measure, 0..1)",
            labels=["resource"],
        )
        for resource, value in self._fragmentation.rates(source.fgd.histogram.workload()).items():
            rates.add_metric([resource], value)
        yield rates


def _counts(name: str, doc: str, label: str, known: tuple[str, ...], counts: Mapping[Any, int]) -> Metric:
    """One series per known value (0 when none: a panel shows a flat line, not "no data"), then any other."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for value in known:
        family.add_metric([value], float(counts.get(value, 0)))
    for other in sorted(str(v) for v in set(counts) - set(known)):  # e.g. a phase a newer CRD brought
        family.add_metric([other], float(sum(n for v, n in counts.items() if str(v) == other)))
    return family
