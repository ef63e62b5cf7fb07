"""The fleet dashboard, built with grafana-foundation-sdk: ``python -m monitoring`` writes fleet.json.

One panel per question an on-call engineer asks first (docs/monitoring.md lists question -> panel): is
there a leader, are the operator and the webhook up, how many groups wait and why, how long groups take
to be Bound, how devices are held, free and unhealthy, how fragmented each resource is, how API writes
and webhook requests end, rebuilds, preemptions. Variables per CONTRACT §11: ``datasource`` (a
Prometheus data source), ``node`` and ``resource`` (multi-value, "All" is ``.*``). Jobs are named
``deviceshare-operator`` and ``deviceshare-webhook`` (the ServiceMonitor and PodMonitors set them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard

UID = "deviceshare-fleet"
OPERATOR_JOB = "deviceshare-operator"
WEBHOOK_JOB = "deviceshare-webhook"
DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
NODES = 'node=~"$node",resource=~"$resource"'  # the per-node device gauges, narrowed by the variables
RATE = "$__rate_interval"

Target = tuple[str, str]  # (PromQL, legend)


def _targets(targets: Sequence[Target]) -> list[Builder[Any]]:
    return [
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
        for i, (expr, legend) in enumerate(targets)
    ]


def _steps(*steps: tuple[float | None, str]) -> dashboard_b.ThresholdsConfig:
    return dashboard_b.ThresholdsConfig().mode(dashboard.ThresholdsMode.ABSOLUTE).steps(
        [dashboard.Threshold(value=value, color=color) for value, color in steps]
    )


GREEN_AT_ZERO = _steps((None, "green"), (1, "red"))  # any count above zero is trouble


def _stat(title: str, description: str, targets: Sequence[Target], thresholds: dashboard_b.ThresholdsConfig,
          unit: str = "short") -> stat.Panel:  # fmt: skip
    return (
        stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
        .targets(_targets(targets)).thresholds(thresholds).color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA).height(4).span(4)
    )  # fmt: skip


def _series(title: str, description: str, targets: Sequence[Target], unit: str = "short", stacked: bool = False,
            span: int = 12) -> timeseries.Panel:  # fmt: skip
    panel = (
        timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
        .targets(_targets(targets)).fill_opacity(10).height(8).span(span)
        .legend(common_b.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM).show_legend(True))
    )  # fmt: skip
    if stacked:
        panel = panel.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL)).fill_opacity(40)
    return panel


def _quantiles(metric: str, by: str = "") -> list[Target]:
    keys = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket[{RATE}])))", f"{legend}p{int(q * 100)}")
        for q in (0.5, 0.99)
    ]


def _allocation_heatmap() -> heatmap.Panel:
    held = f"sum by (node) (deviceshare_devices_allocated{{{NODES}}})"
    ratio = f"{held} / ({held} + sum by (node) (deviceshare_devices_free{{{NODES}}}))"
    return (
        heatmap.Panel().title("Per-node allocation heatmap").datasource(DATASOURCE).height(8).span(12)
        .description("How many nodes (colour) have how much of their devices held (y, 0..1), over time. A band at "
                     "the top is a full cluster; a wide smear in the middle with groups pending is fragmentation.")
        .targets(_targets([(ratio, "{{node}}")])).calculate(True).unit("percentunit")
    )  # fmt: skip


def panels() -> list[tuple[str, list[Builder[Any]]]]:
    """The dashboard's rows, each with its panels."""
    webhook = "deviceshare_webhook_admission_requests_total"
    return [
        ("Is it running", [
            _stat("Leader", "Replicas that schedule now (deviceshare_leader). 1 is right; 0: nobody places groups, "
                  "2: two schedulers (never expected).", [("sum(deviceshare_leader)", "leaders")],
                  _steps((None, "red"), (1, "green"), (2, "red"))),
            _stat("Operator replicas up", "Operator replicas Prometheus scrapes (up). 0: the operator is down.",
                  [(f'sum(up{{job="{OPERATOR_JOB}"}})', "up")], _steps((None, "red"), (1, "green"))),
            _stat("Webhook replicas up", "Webhook replicas answering scrapes. 0: creating a group's pods fails "
                  "(the webhook fails closed).", [(f'sum(up{{job="{WEBHOOK_JOB}"}})', "up")],
                  _steps((None, "red"), (1, "orange"), (2, "green"))),
            _stat("Pending groups", "Groups not Bound yet (status.phase Pending).",
                  [('sum(deviceshare_groups{phase="Pending"})', "pending")], _steps((None, "green"), (1, "orange"))),
            _stat("Unschedulable groups", "Pending groups the last placement found no node for.",
                  [("sum(deviceshare_unschedulable_groups)", "unschedulable")], GREEN_AT_ZERO),
            _stat("Groups on unhealthy devices", "Groups holding a device the node agent reports unhealthy.",
                  [("sum(deviceshare_groups_on_unhealthy_devices)", "groups")], GREEN_AT_ZERO),
        ]),
        ("Devices", [
            _series("Devices held, free and unhealthy per resource", "Whole devices by state, summed over the "
                    "selected nodes. Shares count the device as held.", [
                        (f"sum by (resource) (deviceshare_devices_allocated{{{NODES}}})", "{{resource}} held"),
                        (f"sum by (resource) (deviceshare_devices_free{{{NODES}}})", "{{resource}} free"),
                        (f"sum by (resource) (deviceshare_devices_unhealthy{{{NODES}}})", "{{resource}} unhealthy"),
                    ]),
            _series("Fragmentation per resource", "Share of the open nodes' idle device compute the expected "
                    "workload cannot use (FGD's measure, the one deviceshare simulate uses). High with groups "
                    "pending for want of devices: the free devices are spread too thin.",
                    [('deviceshare_fragmentation{resource=~"$resource"}', "{{resource}}")], unit="percentunit"),
            _allocation_heatmap(),
            _series("Device compute and memory given out", "Compute (in devices) and device memory held, shares "
                    "counted by their size, over what the selected nodes have.", [
                        (f"sum by (resource) (deviceshare_compute_allocated{{{NODES}}}) / sum by (resource) "
                         f"(deviceshare_devices_allocated{{{NODES}}} + deviceshare_devices_free{{{NODES}}})",
                         "{{resource}} compute"),
                        (f"sum by (resource) (deviceshare_device_memory_allocated_bytes{{{NODES}}}) / sum by "
                         f"(resource) (deviceshare_device_memory_bytes{{{NODES}}})", "{{resource}} memory"),
                    ], unit="percentunit"),
        ]),
        ("Groups", [
            _series("Groups by phase", "SharedDeviceGroups by status.phase.",
                    [("sum by (phase) (deviceshare_groups)", "{{phase}}")], stacked=True),
            _series("Pending groups by reason", "Unschedulable groups by the kind of reason that rejected the most "
                    "nodes (devices, device_memory, compute, tiles, cpu, memory, selector, taints, quota, "
                    "not_ready, gang_waiting, other).",
                    [("sum by (reason) (deviceshare_unschedulable_groups) > 0", "{{reason}}")], stacked=True),
            _series("Time to Bound", "From a group's creation to its status turning Bound, p50 and p99.",
                    _quantiles("deviceshare_group_time_to_bound_seconds"), unit="s"),
            _series("Placement latency", "From taking a pod off the queue to its binding, p50 and p99.",
                    _quantiles("deviceshare_placement_duration_seconds"), unit="s"),
            _series("Scheduling cycles by result", "Pods bound, parked as unschedulable, retried, refused.",
                    [(f"sum by (result) (rate(deviceshare_placements_total[{RATE}]))", "{{result}}")], unit="ops"),
            _series("Scheduling queue", "Pods waiting for a decision, and parked as unschedulable.", [
                ("sum(deviceshare_queue_pending)", "pending"), ("sum(deviceshare_queue_parked)", "parked")]),
        ]),
        ("API and webhook", [
            _series("API writes by outcome", "Every write the operator sends, by result (ok, conflict, "
                    "uncertain_resolved, failed, fenced).",
                    [(f"sum by (result) (rate(deviceshare_api_writes_total[{RATE}]))", "{{result}}")], unit="ops",
                    stacked=True),
            _series("Webhook requests by path and result", "AdmissionReviews answered (patched, unchanged, "
                    "skipped, denied, warming, error, malformed).",
                    [(f"sum by (path, result) (rate({webhook}[{RATE}]))", "{{path}} {{result}}")], unit="reqps"),
            _series("Webhook errors", "Share of reviews the webhook could not decide (error, warming). Pods of "
                    "a group cannot be created while it fails: the webhook fails closed.",
                    [(f'(sum(rate({webhook}{{result=~"error|warming"}}[{RATE}])) or vector(0)) / '
                      f"sum(rate({webhook}[{RATE}]))", "errors")], unit="percentunit"),
            _series("Webhook latency", "Time to answer a review, p50 and p99 per path (the API server gives up "
                    "after the webhook's timeoutSeconds).",
                    _quantiles("deviceshare_webhook_admission_duration_seconds", by="path"), unit="s"),
        ]),
        ("Leader, rebuilds, safety", [
            _series("Leader and rebuilds", "Replicas leading, and ledger rebuilds (each start and election "
                    "rebuilds from the API before scheduling).", [
                        ("sum(deviceshare_leader)", "leaders"),
                        (f"sum(increase(deviceshare_rebuilds_total[{RATE}]))", "rebuilds")], span=8),
            _series("Last rebuild", "Duration of the last ledger rebuild (left axis), and the nodes, groups and "
                    "pods it read (right axis).", [
                        ("max(deviceshare_ledger_rebuild_seconds)", "seconds"),
                        ("max by (kind) (deviceshare_rebuild_objects)", "{{kind}}")], unit="s", span=8)
            .override_by_query("B", [dashboard.DynamicConfigValue("unit", "short"),
                                     dashboard.DynamicConfigValue("custom.axisPlacement", "right")]),
            _series("Devices claimed twice, untrusted claims", "Found by a rebuild: a device two groups claim, a "
                    "pod claiming devices no record of ours backs. Both should stay 0.", [
                        (f"sum(increase(deviceshare_device_conflicts_total[{RATE}]))", "claimed twice"),
                        (f"sum(increase(deviceshare_untrusted_claims_total[{RATE}]))", "untrusted claims")], span=8),
        ]),
        ("Preemption and health", [
            _series("Preemptions", "Preemption attempts by result, victim groups, and preemptors nominated.", [
                (f"sum by (result) (rate(deviceshare_preemptions_total[{RATE}]))", "{{result}}"),
                (f"sum(rate(deviceshare_preemption_victims_total[{RATE}]))", "victim groups"),
                ("sum(deviceshare_nominations)", "nominated")], span=12),
            _series("Unhealthy devices by node", "Devices the node agent reports unhealthy (XID errors, lost).",
                    [(f"sum by (node, resource) (deviceshare_devices_unhealthy{{{NODES}}}) > 0",
                      "{{node}} {{resource}}")], span=12),
        ]),
    ]


def variables() -> list[Builder[dashboard.VariableModel]]:
    def per_node(name: str, label: str) -> dashboard_b.QueryVariable:
        return (
            dashboard_b.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query(f"label_values(deviceshare_devices_free, {name})")
            .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True).all_value(".*").multi(True).sort(dashboard.VariableSort.ALPHABETICAL_ASC)
            .current(dashboard.VariableOption(text="All", value="$__all"))
        )  # fmt: skip

    return [
        dashboard_b.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        per_node("node", "Node"),
        per_node("resource", "Resource"),
    ]


def build() -> dict[str, Any]:
    """The dashboard's JSON model."""
    board = (
        dashboard_b.Dashboard("deviceshare / Fleet").uid(UID).tags(["deviceshare"]).refresh("30s")
        .time("now-6h", "now").timezone("browser").variables(variables())
        .description("deviceshare at a glance: leader, groups and why they wait, devices and fragmentation, API "
                     "writes, webhook, rebuilds, preemption. See docs/monitoring.md.")
    )  # fmt: skip
    next_id = 1
    for title, row in panels():
        board = board.with_row(dashboard_b.Row(title).id(next_id))
        next_id += 1
        for panel in row:
            board = board.with_panel(panel.id(next_id))  # type: ignore[attr-defined]
            next_id += 1
    model: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return model


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"
