"""How a group's share reads in ``deviceshare inspect``: from its spec and status to the core's terms, and
back to the JSON ``-o json`` prints (CONTRACT §7). Kept apart so inspect.py stays about devices and tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.api import quantities
from deviceshare.core import capacity


def shares(group: Mapping[str, Any]) -> dict[str, capacity.Share]:
    """The group's share per resource; none for a spec that does not parse (shown as whole)."""
    from deviceshare.api import models  # pydantic loads on use: `--help` stays fast

    try:
        spec = models.GroupSpec.model_validate(group.get("spec") or {})
    except ValueError:  # pydantic's ValidationError
        return {}
    return capacity.shares_from_spec(spec.share)


def tiles(status: Mapping[str, Any], resource: str) -> dict[str, tuple[int, ...]]:
    """device -> tile indices of ``status.allocatedTiles``; none when they do not parse."""
    try:
        return capacity.parse_tile_ids([str(t) for t in (status.get("allocatedTiles") or {}).get(resource) or []])
    except ValueError:
        return {}


def share_json(share: capacity.Share | None, tile_indices: tuple[int, ...]) -> dict[str, Any]:
    """``{"share": {...}}`` for a holder's JSON entry, in the quantities the spec uses; {} for a whole holder."""
    if share is None:
        return {}
    out: dict[str, Any] = {}
    if share.tiles:
        out = {"tiles": share.tiles, "tileIndices": list(tile_indices)}
    if share.compute_milli:
        out["compute"] = quantities.format_milli(share.compute_milli)
    if share.memory_bytes:
        out["memory"] = quantities.format_bytes(share.memory_bytes)
    return {"share": out}
