"""Server-side ``Table`` output (``meta.k8s.io/v1``), what ``kubectl get`` asks for and prints.

Custom resources get their CRD's ``additionalPrinterColumns`` (JSONPath-lite: dotted paths),
with ``date`` columns shown as ages ("5m") as kube-apiserver does; a few built-ins get the
columns kubectl users expect (pods: READY/STATUS/RESTARTS/AGE/NODE, nodes: STATUS/AGE..., deployments:
READY/UP-TO-DATE/AVAILABLE/AGE, pdb: MIN AVAILABLE/MAX UNAVAILABLE/ALLOWED DISRUPTIONS/AGE, priorityclasses:
VALUE/GLOBAL-DEFAULT/AGE/PREEMPTIONPOLICY).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceshare.sandbox import catalog

Row = Mapping[str, Any]


def age(timestamp: str | None) -> str:
    """kubectl's short duration: 45s, 5m, 3h, 2d."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def lookup(obj: Any, json_path: str) -> Any:
    node = obj
    for part in [p for p in json_path.strip().lstrip(".").split(".") if p]:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return None
    return node


def _cell(value: Any, type_: str) -> Any:
    if value is None:
        return None
    if type_ == "date":
        return age(value) if isinstance(value, str) else value
    if isinstance(value, Mapping | list):
        return json.dumps(value, separators=(",", ":"))
    return value


def _pod_cells(pod: Row) -> list[Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    containers = pod.get("spec", {}).get("containers") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = pod.get("status", {}).get("phase", "Pending")
    if pod.get("metadata", {}).get("deletionTimestamp"):
        phase = "Terminating"
    return [
        f"{ready}/{len(containers)}",
        phase,
        restarts,
        age(pod["metadata"].get("creationTimestamp")),
        pod.get("spec", {}).get("nodeName") or "<none>",
    ]


def _node_cells(node: Row) -> list[Any]:
    conditions = node.get("status", {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), "Unknown")
    status = "Ready" if ready == "True" else "NotReady"
    if node.get("spec", {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    return [
        status,
        "<none>",
        age(node["metadata"].get("creationTimestamp")),
        node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""),
    ]


def _event_cells(event: Row) -> list[Any]:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    seen = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    return [
        age(seen),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message") or event.get("note") or "",
    ]


def _deployment_cells(deployment: Row) -> list[Any]:
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    return [
        f"{int(status.get('readyReplicas') or 0)}/{int(spec.get('replicas', 1))}",
        int(status.get("updatedReplicas") or 0),
        int(status.get("availableReplicas") or 0),
        age(deployment.get("metadata", {}).get("creationTimestamp")),
    ]


def _budget_cells(budget: Row) -> list[Any]:
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    return [
        str(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
        str(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
        int(status.get("disruptionsAllowed") or 0),
        age(budget.get("metadata", {}).get("creationTimestamp")),
    ]


def _priority_class_cells(pc: Row) -> list[Any]:
    return [
        int(pc.get("value") or 0),
        bool(pc.get("globalDefault", False)),
        age(pc.get("metadata", {}).get("creationTimestamp")),
        pc.get("preemptionPolicy", ""),
    ]


def _claim_cells(claim: Row) -> list[Any]:
    """pkg/printers/internalversion resourceClaimState: deleted, pending, allocated, reserved."""
    md, status = claim.get("metadata") or {}, claim.get("status") or {}
    states = ["deleted"] if md.get("deletionTimestamp") else []
    if status.get("allocation") is None:
        states += [] if md.get("deletionTimestamp") else ["pending"]
    else:
        states += ["allocated", "reserved"] if status.get("reservedFor") else ["allocated"]
    return [",".join(states), age(md.get("creationTimestamp"))]


def _slice_cells(resource_slice: Row) -> list[Any]:
    spec = resource_slice.get("spec") or {}
    return [spec.get("nodeName", ""), spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""),
            age(resource_slice.get("metadata", {}).get("creationTimestamp"))]


# kubectl's columns for events put the name last and hidden (priority 1)
_EVENT_COLUMNS = [
    ("Last Seen", "string", 0),
    ("Type", "string", 0),
    ("Reason", "string", 0),
    ("Object", "string", 0),
    ("Message", "string", 0),
]

_BUILTIN: dict[tuple[str, str], tuple[list[tuple[str, str, int]], Callable[[Row], list[Any]]]] = {
    ("", "pods"): (
        [
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "integer", 0),
            ("Age", "string", 0),
            ("Node", "string", 1),
        ],
        _pod_cells,
    ),
    ("", "events"): (_EVENT_COLUMNS, _event_cells),
    ("events.k8s.io", "events"): (_EVENT_COLUMNS, _event_cells),
    ("apps", "deployments"): (
        [("Ready", "string", 0), ("Up-to-date", "integer", 0), ("Available", "integer", 0), ("Age", "string", 0)],
        _deployment_cells,
    ),
    ("", "nodes"): (
        [("Status", "string", 0), ("Roles", "string", 0), ("Age", "string", 0), ("Version", "string", 0)],
        _node_cells,
    ),
    ("policy", "poddisruptionbudgets"): (
        [("Min Available", "string", 0), ("Max Unavailable", "string", 0), ("Allowed Disruptions", "integer", 0),
         ("Age", "string", 0)],
        _budget_cells,
    ),
    ("resource.k8s.io", "resourceclaims"): ([("State", "string", 0), ("Age", "string", 0)], _claim_cells),
    ("resource.k8s.io", "resourceslices"): (
        [("Node", "string", 0), ("Driver", "string", 0), ("Pool", "string", 0), ("Age", "string", 0)],
        _slice_cells,
    ),
    ("scheduling.k8s.io", "priorityclasses"): (
        [("Value", "integer", 0), ("Global-Default", "boolean", 0), ("Age", "string", 0),
         ("PreemptionPolicy", "string", 0)],
        _priority_class_cells,
    ),
}


def table(
    rtype: catalog.ResourceType, items: Sequence[Row], resource_version: str, include_object: str = "Metadata"
) -> dict[str, Any]:
    columns: list[dict[str, Any]] = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name must be unique within a namespace.",
        }
    ]
    cells: Callable[[Row], list[Any]]
    if rtype.printer_columns:
        specs = list(rtype.printer_columns)
        columns += [
            {
                "name": c["name"],
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "priority": c.get("priority", 0),
                "description": c.get("description", ""),
            }
            for c in specs
        ]

        def cells(obj: Row) -> list[Any]:
            return [_cell(lookup(obj, c["jsonPath"]), c.get("type", "string")) for c in specs]
    elif rtype.key in _BUILTIN:
        extra, cells = _BUILTIN[rtype.key]
        columns += [
            {"name": n, "type": t, "format": "", "priority": p, "description": ""} for n, t, p in extra
        ]
    else:
        columns.append({"name": "Age", "type": "string", "format": "", "priority": 0, "description": ""})

        def cells(obj: Row) -> list[Any]:
            return [age(obj.get("metadata", {}).get("creationTimestamp"))]

    name_last = rtype.plural == "events" and not rtype.printer_columns
    if name_last:
        columns = [*columns[1:], dict(columns[0], priority=1)]
    rows = []
    for obj in items:
        name = obj["metadata"]["name"]
        row: dict[str, Any] = {"cells": [*cells(obj), name] if name_last else [name, *cells(obj)]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
