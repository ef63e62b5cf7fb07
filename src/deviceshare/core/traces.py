"""Node and pod lists in the openb trace's CSV columns, parsed with errors that name the line.

Nodes: ``cpu_milli, memory_mib, gpu, model`` (and a name column ``sn`` or ``name``, optional).
Pods: ``cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec`` (``gpu_spec`` optional, ``A|B``).
Extra columns are ignored. Parsing takes text (an iterable of lines) so the core stays free of I/O.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable

from deviceshare.core import fragmentation as frag
from deviceshare.core import nodeclasses

NODE_COLUMNS = ("cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A CSV that cannot be read as a node or pod list; the message names the file and line."""


def _rows(lines: Iterable[str], source: str, required: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(lines)
    header = reader.fieldnames
    if not header:
        raise TraceError(f"{source}: empty file (expected a header with {', '.join(required)})")
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"{source}:1: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
    for row in reader:
        if None in row or any(row.get(c) is None for c in required):
            raise TraceError(f"{source}:{reader.line_num}: expected {len(header)} fields")
        yield reader.line_num, row


def _int(row: dict[str, str], column: str, source: str, line: int, low: int = 0) -> int:
    text = (row[column] or "").strip()
    try:
        value = int(float(text)) if text else 0
    except ValueError:
        raise TraceError(f"{source}:{line}: {column} must be a number, got {text!r}") from None
    if value < low:
        raise TraceError(f"{source}:{line}: {column} must be at least {low}, got {value}")
    return value


def parse_nodes(lines: Iterable[str], source: str = "<nodes>") -> list[nodeclasses.Node]:
    nodes: list[nodeclasses.Node] = []
    for line, row in _rows(lines, source, NODE_COLUMNS):
        name = (row.get("sn") or row.get("name") or f"node-{len(nodes):05d}").strip()
        nodes.append(
            nodeclasses.Node(
                name=name,
                cpu_milli=_int(row, "cpu_milli", source, line),
                memory_mib=_int(row, "memory_mib", source, line),
                gpus=_int(row, "gpu", source, line),
                model=(row["model"] or "").strip(),
            )
        )
    if not nodes:
        raise TraceError(f"{source}: no nodes")
    return nodes


def parse_pods(lines: Iterable[str], source: str = "<pods>") -> list[nodeclasses.Pod]:
    pods: list[nodeclasses.Pod] = []
    for line, row in _rows(lines, source, POD_COLUMNS):
        milli = _int(row, "gpu_milli", source, line)
        num = _int(row, "num_gpu", source, line)
        if num > 1 and 0 < milli < frag.MILLI:
            raise TraceError(f"{source}:{line}: a GPU share ({milli} milli) must be on one GPU, got num_gpu={num}")
        shape = frag.normalized_shape(
            _int(row, "cpu_milli", source, line), milli, num, (row.get("gpu_spec") or "").strip()
        )
        pods.append(nodeclasses.Pod(shape, _int(row, "memory_mib", source, line)))
    if not pods:
        raise TraceError(f"{source}: no pods")
    return pods
