"""`deviceshare explain POD`: why a pod is (not) running on shared devices, in plain words.

It reads what the operator already recorded — the pod's ``PodScheduled`` condition (kube-scheduler
wording, e.g. ``0/4 nodes are available: 4 insufficient nvidia.com/gpu.``), its latest
``FailedScheduling`` event, the group's phase and conditions — and adds one hint per reason, computed
from the same device map ``deviceshare inspect`` shows. It never guesses beyond what the API says.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deviceshare.api import names
from deviceshare.cli import capacityhints, claimview, handoverview, linkview
from deviceshare.cli import inspect as inspect_
from deviceshare.core import inventory, reasons

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

_COUNTED = re.compile(r"^\d+/\d+ nodes are available: (?P<reasons>.*?)\.?$")
_REASON = re.compile(r"^(?P<count>\d+) (?P<reason>.+)$")
_GANG_WIDE = re.compile(r"^gang of (?P<n>\d+) member pods: ")
_GANG_WAITING = re.compile(r"^(?P<present>\d+)/(?P<needed>\d+) member pods exist")


@dataclasses.dataclass(frozen=True)
class Facts:
    """Everything explain looks at, read once."""

    pod: dict[str, Any]
    group: dict[str, Any] | None
    events: list[dict[str, Any]]
    snapshot: inspect_.Snapshot
    claim: dict[str, Any] | None = None  # a DRA group's ResourceClaim (CONTRACT §13), as the API shows it


def split_reasons(message: str) -> dict[str, int]:
    """``0/4 nodes are available: 3 insufficient nvidia.com/gpu, 1 not in shared mode.`` -> counts (a gang's
    ``gang of 3 member pods: `` prefix and a ``preemption: ...`` sentence after the counts are set aside)."""
    message = _GANG_WIDE.sub("", message.strip()).split(". ", 1)[0]
    match = _COUNTED.match(message)
    if not match:
        return {}
    out: dict[str, int] = {}
    for part in match.group("reasons").split(", "):
        counted = _REASON.match(part.strip())
        if counted:
            out[counted.group("reason")] = int(counted.group("count"))
        elif part.strip():
            out[part.strip()] = 0
    return out


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def _group_name(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    return (meta.get("annotations") or {}).get(names.POD_GROUP_ANNOTATION) or (meta.get("labels") or {}).get(
        names.POD_GROUP_LABEL
    )


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _hints(facts: Facts, message: str) -> list[str]:
    """One line per reason the operator gave, with what would change the answer."""
    group = facts.group
    spec = (group or {}).get("spec") or {}
    ns = str(facts.pod["metadata"].get("namespace", ""))
    name = _group_name(facts.pod) or ""
    devices = facts.snapshot.device_map()
    infos = [inventory.node_from_object(n) for n in facts.snapshot.nodes]
    hints: list[str] = []
    if "not found in namespace" in message or (name and group is None):
        others = sorted(str(g["metadata"]["name"]) for g in facts.snapshot.groups
                        if g["metadata"].get("namespace") == ns)
        hints.append(f'Group "{name}" does not exist in namespace "{ns}". '
                     + (f"Groups there: {', '.join(others)}." if others else "There are no groups in that namespace.")
                     + " Create it, or fix the pod's deviceshare.io/device-group annotation.")
    if "maxMembers" in message:
        pod_name = facts.pod["metadata"].get("name")
        others = [m for m in ((group or {}).get("status") or {}).get("members") or [] if m != pod_name]
        hints.append(f"The group is full (maxMembers {spec.get('maxMembers')}; other members: "
                     f"{', '.join(others) or 'none'}). Raise spec.maxMembers or delete a member.")
    for reason, count in split_reasons(message).items():
        share_hint = (capacityhints.capacity_hint(reason, count, spec, devices)
                      or capacityhints.withheld_hint(reason, count, devices))
        if share_hint:
            hints.append(share_hint)
        elif reason.startswith("insufficient "):
            resource = reason.removeprefix("insufficient ")
            claim = spec.get("claim") or {}  # a DRA group asks for count devices of its DeviceClass
            need = claim.get("count") if claim.get("deviceClassName") == resource else (
                spec.get("resources") or {}).get(resource)
            free = ", ".join(f"{n.name} {len(n.free(resource))}/{n.total(resource)}"
                             for n in devices if n.exists and n.shared and resource in n.resources)
            if resource in ("cpu", "memory"):
                hints.append(f"{count} node(s) lack the {resource} the pod requests; lower its requests.")
            else:
                hints.append(f"The group needs {need if need is not None else '?'} {resource} on ONE node; "
                             f"free {resource} per shared node: {free or 'no shared node has any'}.")
                largest = max((n.total(resource) for n in devices if n.exists and n.shared), default=0)
                if isinstance(need, int) and need > largest:
                    hints.append(f"No shared node has {need} {resource} at all (the largest has {largest}): "
                                 f"lower spec.resources or add a bigger node; waiting will not help.")
        elif reason == reasons.GROUP_SELECTOR:
            selector = spec.get("nodeSelector") or {}
            matching = [i.name for i in infos if _matches(i.labels, selector)]
            shared = [i.name for i in infos if i.shared and _matches(i.labels, selector)]
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
            hints.append(f"The group's nodeSelector wants {wanted}; nodes with those labels: "
                         f"{', '.join(matching) or 'none'} (in shared mode: {', '.join(shared) or 'none'}). "
                         f"Label a shared node, e.g. kubectl label node NODE {wanted.replace(', ', ' ')}.")
        elif reason == reasons.NOT_SHARED:
            hints.append(f"{count} node(s) are not in shared mode; "
                         f"kubectl label node NODE {names.NODE_MODE_LABEL}={names.NODE_MODE_SHARED}.")
        elif reason == reasons.NODE_AFFINITY:
            hints.append(f"{count} node(s) don't match the pod's own nodeSelector/affinity "
                         f"({json.dumps((facts.pod.get('spec') or {}).get('nodeSelector') or {})}).")
        elif reason.startswith("node(s) had untolerated taint"):
            hints.append(f"{count} node(s) carry a taint the pod does not tolerate; add a toleration to the pod.")
        elif reason in (reasons.NOT_READY, reasons.UNSCHEDULABLE):
            hints.append(f"{count} {reason}: check kubectl get nodes.")
        elif reason == reasons.INVALID_INVENTORY:
            bad = [f"{i.name}: {'; '.join(i.problems)}" for i in infos if i.problems]
            hints.append(f"Fix the node's device annotations: {' | '.join(bad) or '?'}.")
        elif reason == reasons.NO_MPS:
            ready = [i.name for i in infos if i.shared and i.mps_ready]
            hints.append(f"{count} node(s) run no MPS control daemon, and the operator enforces shares with MPS "
                         f"(--mps); nodes that do: {', '.join(ready) or 'none'}. Install the MPS overlay "
                         f"(manifests/overlays/mps), whose node agent annotates {names.NODE_MPS_ANNOTATION}=ready.")
    hints += _gang_and_priority_hints(facts, message)
    if "is being deleted" in message:
        hints.append("The group is being deleted; its pods will not be placed. Recreate the group after it is gone.")
    if "also claimed by" in message:
        hints.append("Two groups claim the same devices; `deviceshare inspect` shows them as CONFLICT.")
    return hints


def _gang_and_priority_hints(facts: Facts, message: str) -> list[str]:
    """CONTRACT §8: a gang waiting for members or for one node to take all of them; a preemption under way."""
    hints: list[str] = []
    # The count as the group's condition has it now: a pod's condition and events were written when the pod
    # was last tried, before later members existed. The pod's own words only where the group has none.
    group_condition = _condition(facts.group or {}, names.CONDITION_SCHEDULED)
    waiting = _GANG_WAITING.match(str((group_condition or {}).get("message") or "") if group_condition else message)
    if waiting:
        missing = int(waiting["needed"]) - int(waiting["present"])
        hints.append(f"The group is a gang (minMembers {waiting['needed']}): nothing is placed or held until "
                     f"{waiting['needed']} member pods exist; {waiting['present']} do now, {missing} more to create.")
    wide = _GANG_WIDE.match(message)
    if wide:
        hints.append(f"A gang starts on ONE node with room for all {wide['n']} pods at once (their CPU and memory "
                     "requests add up, beside the group's devices); lower the pods' requests or spec.minMembers.")
    if "preempting " in message or "Preempting on node" in message:
        status = ((facts.group or {}).get("status") or {})
        hints.append(f"Lower-priority groups are being evicted to make room (nominated node "
                     f"{status.get('nominatedNodeName') or '?'}); the pod is placed once they are gone.")
    if "preemptionPolicy=Never" in message:
        hints.append("Its PriorityClass says preemptionPolicy: Never, so it waits for room instead of evicting "
                     "lower-priority groups.")
    return hints


def explain(facts: Facts) -> list[str]:
    pod = facts.pod
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    group_name = _group_name(pod)
    lines: list[str] = []
    node = spec.get("nodeName")
    phase = (pod.get("status") or {}).get("phase", "Pending")
    if node:
        selected = (meta.get("annotations") or {}).get(names.POD_SELECTED_DEVICES_ANNOTATION)
        lines.append(f"Pod {ns}/{name} is bound to node {node} (phase {phase})"
                     + (f", devices {selected}." if selected else "."))
        if selected:  # CONTRACT §12: how its containers were handed them
            lines.append(f"Hand-over: {handoverview.of_pod(pod)}.")
    else:
        lines.append(f"Pod {ns}/{name} is NOT bound to a node (phase {phase}).")
    if not group_name:
        lines.append(f"It does not join a SharedDeviceGroup (no {names.POD_GROUP_ANNOTATION} annotation); "
                     "deviceshare does not schedule it.")
        return lines
    if spec.get("schedulerName") != names.DEFAULT_SCHEDULER_NAME and not node:
        lines.append(f"Its schedulerName is {spec.get('schedulerName')!r}, not {names.DEFAULT_SCHEDULER_NAME!r}: "
                     "was it created before the webhook was installed?")
    scheduled = _condition(pod, "PodScheduled")
    message = ""
    if scheduled is not None and scheduled.get("status") != "True":
        message = str(scheduled.get("message") or "")
        lines.append(f"Scheduler says ({scheduled.get('reason', '')}): {message}")
    failed = [e for e in facts.events if e.get("reason") == "FailedScheduling"]
    if failed and not node:
        latest = max(failed, key=_event_time)
        lines.append(f"Latest FailedScheduling event ({_event_time(latest)}, x{latest.get('count', 1)}): "
                     f"{latest.get('message', '')}")
        message = message or str(latest.get("message") or "")
    group = facts.group
    if group is None:
        lines.append(f"Group {ns}/{group_name}: not found.")
    else:
        status = group.get("status") or {}
        where = (f"on node {status['nodeName']}, devices "
                 + "; ".join(f"{r}={','.join(ids)}" for r, ids in (status.get("allocatedDevices") or {}).items())
                 if status.get("nodeName") else "not placed yet")
        limit = (group.get("spec") or {}).get("maxMembers") or 0
        members = status.get("members") or []
        shown_phase = status.get("phase") or "none yet (no status: is the operator running?)"
        lines.append(f"Group {ns}/{group_name}: phase {shown_phase}, {where}; "
                     f"members {len(members)}{f'/{limit}' if limit else ''}"
                     + (f" ({', '.join(members)})" if members else "") + ".")
        node_info = next((inventory.node_from_object(n) for n in facts.snapshot.nodes
                          if (n.get("metadata") or {}).get("name") == status.get("nodeName")), None)
        if node_info is not None:
            for text in linkview.group_links(node_info.topology, status.get("allocatedDevices") or {}):
                lines.append(f"  devices {text}")
        if (group.get("spec") or {}).get("claim"):
            lines.append(claimview.describe(facts.claim, ns, group_name))
        for c in status.get("conditions") or []:
            lines.append(f"  condition {c.get('type')}={c.get('status')} ({c.get('reason', '')}): "
                         f"{c.get('message', '')}")
        if (group.get("metadata") or {}).get("deletionTimestamp"):
            lines.append(_deleting(ns, members))
    if not node:
        scheduled_reason = _group_not_scheduled(group)
        hints = _hints(facts, message)
        if scheduled_reason == "PodsSkippedWebhook":
            hints.append("These pods were created while the admission webhook did not run, so nothing scheduled "
                         "them: make it run (kubectl -n deviceshare-system get pods), then delete and recreate "
                         "the pods the condition names.")
        note = facts.snapshot.dra.note()  # the hints below could not see what the user may not read
        if note:
            lines.append(note)
        if hints:
            lines.append("What would help:")
            lines += [f"  - {h}" for h in hints]
        elif not message and not scheduled_reason:
            lines.append("The operator has recorded no reason yet: is it running? (kubectl -n deviceshare-system "
                         "get pods)")
    return lines


def _group_not_scheduled(group: Mapping[str, Any] | None) -> str:
    """The reason of the group's Scheduled=False condition: a reason the operator recorded, if not the pod's."""
    condition = _condition(group or {}, names.CONDITION_SCHEDULED)
    return str(condition.get("reason") or "") if condition and condition.get("status") == "False" else ""


def _deleting(ns: str, members: list[str]) -> str:
    """A deleted group keeps its devices, and `kubectl delete` waits, until no member pod runs on them."""
    if not members:
        return "The group is being deleted: it releases its devices once the operator sees no member pod on them."
    return (f"The group is being deleted, and keeps its devices until its member pods are gone "
            f"({', '.join(members)}): `kubectl delete sdg` waits for that. Delete them or let them finish: "
            f"kubectl delete pod -n {ns} {' '.join(members)}")


# -- reading -----------------------------------------------------------------------------------


async def read_facts(api: k8s.ApiClient, namespace: str, pod_name: str) -> Facts:
    from deviceshare.kube import rest  # the client library loads on use: `--help` stays fast

    pod = await inspect_.get_json(api, f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    group_name = _group_name(pod)
    group = None
    if group_name:
        try:
            group = await inspect_.get_json(
                api, f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{group_name}"
            )
        except rest.ApiError as e:
            if e.status != 404:
                raise
    events = await inspect_.get_json(
        api, f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{pod_name}"
    )
    snapshot = await inspect_.read_snapshot(api, pods=False)
    uid = (pod.get("metadata") or {}).get("uid")
    mine = [e for e in events.get("items") or []
            if not uid or (e.get("involvedObject") or {}).get("uid") in (None, uid)]
    claim = await claimview.read_claim(api, namespace, group_name) if ((group or {}).get("spec") or {}).get(
        "claim") and group_name else None
    return Facts(pod, group, mine, snapshot, claim)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", metavar="POD", help="the pod's name")
    parser.add_argument("-n", "--namespace", help="the pod's namespace (default: the kubeconfig context's)")
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")


async def run_async(kubeconfig: str | None, namespace: str, pod: str, *, context: str | None = None) -> list[str]:
    from deviceshare.kube import connecting

    async with await connecting.api_client(kubeconfig, context=context) as api:
        return explain(await read_facts(api, namespace, pod))


def run(args: argparse.Namespace) -> int:
    from deviceshare.kube import connecting, rest

    try:
        # The namespace and the connection from one reading of the kubeconfig files (connecting.current_context).
        context, default_namespace = connecting.current_context(args.kubeconfig, args.context)
        namespace = args.namespace or default_namespace
        lines = asyncio.run(run_async(args.kubeconfig, namespace, args.pod, context=context))
    except rest.ApiError as e:
        if e.status == 404:
            print(f"deviceshare explain: pod {args.pod} not found in namespace {namespace}", file=sys.stderr)
        else:
            print(f"deviceshare explain: {e.status} {e.message}", file=sys.stderr)
        return 1
    except OSError as e:  # the API server did not answer (a missing kubeconfig is the CLI's ConfigError)
        print(f"deviceshare explain: cannot reach the API server: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0

