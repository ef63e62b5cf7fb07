"""A member pod's device annotations put back from its group's allocation, when someone changed them.

The reconciler asks for it on every reconcile of a placed group (and of a gone group whose members still run:
their annotations are then the only record a restarted operator can rebuild the claim from). It writes only to
pods we bound into the group, on the group's node; what the API refuses is said in an event on the pod.
"""

from __future__ import annotations

from deviceshare.api import names
from deviceshare.core import ledger as ledgers

from . import memberannotations, storage
from . import state as state_
from .context import Context


async def restore(
    ctx: Context, gkey: state_.GroupKey, allocation: ledgers.Allocation, members: list[state_.PodRecord]
) -> None:
    """Put back what a member's owner changed. ``members`` are the pods we bound into this group (our
    records, not their annotations); one on another node never gets this group's device IDs."""
    want = memberannotations.allocation_annotations(
        allocation, ctx.config.env_names, ctx.ledger.node(allocation.node)
    )
    want_env = names.env_from_annotations(want)
    for pod in members:
        if pod.member_of != gkey[1] or pod.node_name != allocation.node:
            continue
        if (
            pod.group == gkey[1]
            and pod.selected_devices == want[names.POD_SELECTED_DEVICES_ANNOTATION]
            and dict(pod.env_annotations) == want_env
        ):
            continue
        stale: dict[str, str | None] = {
            names.env_annotation(e): None for e in pod.env_annotations if e not in want_env
        }
        # The group annotation too: un-joining or re-pointing a bound member changes nothing we decide,
        # but everything that reads the pod (kubectl, inspect, the webhook's member count) should agree.
        stale[names.POD_GROUP_ANNOTATION] = gkey[1]
        try:
            await ctx.api.annotate_pod(pod.key, pod.uid, {**stale, **want})
        except (storage.Gone, storage.Conflict):
            continue
        except storage.Invalid as e:  # refused (a policy, RBAC): say so where the pod's owner looks
            ctx.event(pod, "DeviceAnnotationsNotRestored", f"could not put back the device "
                      f"annotations of SharedDeviceGroup \"{gkey[1]}\": {e}", warning=True)
            continue
        ctx.event(
            pod, "DeviceAnnotationsRestored",
            "device annotations did not match the group's allocation and were put back", warning=True,
        )
