"""The node agent's loop: read the devices, publish what changed, sleep; wake early when a GPU falls ill.

Each sync reads every source (NVML and/or a device file, in a worker thread: NVML calls block), adds the
GPUs the XID watch found unhealthy and the MPS daemon's readiness, turns that into the annotation values
(:mod:`readings`) and writes only those that differ from what the Node carries (:mod:`publishing`). What
the Node carries is read once at start and again every ``resync`` seconds (someone may have edited or
removed an annotation); between those, a node whose devices did not change costs no API request at all.

A source that fails (a device file with a typo, NVML answering errors) is logged and skipped for that
sync: the annotations published last stay, rather than a node losing its devices to a typo. An API
error is logged and the sync is tried again after ``interval``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from deviceshare.kube import rest
from deviceshare.nodeagent import publishing, readings

logger = logging.getLogger("deviceshare.nodeagent")


class Source(Protocol):
    def read(self) -> readings.NodeReading: ...


def mps_ready(pipe_directory: Path) -> bool:
    """Whether an MPS control daemon listens on ``<pipe directory>/control`` (a stale socket file does not).

    Connected to as its clients connect (CONTRACT §12): ``nvidia-cuda-mps-control -d`` listens on a
    ``SOCK_SEQPACKET`` Unix socket (``lsof`` shows ``control type=SEQPACKET (LISTEN)``; measured on an H200,
    driver 580: ``/proc/net/unix`` type 0005, and a ``SOCK_STREAM`` connect fails with ``EPROTOTYPE``). The
    daemon serves one client at a time and waits seconds for a silent one's credentials, so the probe closes
    at once and says nothing: holding the connection would turn real CUDA clients away meanwhile."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(1.0)
    try:
        sock.connect(str(pipe_directory / "control"))
    except OSError:
        return False
    finally:
        sock.close()
    return True


@dataclass
class AgentConfig:
    interval: float = 30.0  # between reads of the devices
    resync: float = 300.0  # between reads of the Node itself
    mps_pipe_directory: Path | None = None  # None: MPS readiness is not published


@dataclass
class NodeAgent:
    api: publishing.NodeApi
    sources: Sequence[Source]
    config: AgentConfig = field(default_factory=AgentConfig)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._carried: readings.Annotations | None = None  # what the Node carries, as last known
        self._read_at = 0.0
        self._sick: dict[str, str] = {}  # device ID -> why, from the XID watch (sticky)
        self._last: tuple[readings.NodeReading, readings.Annotations] | None = None  # reading -> its values
        self.wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def mark_unhealthy(self, device: str, why: str) -> None:
        """From any thread: ``device`` is unhealthy from now on; the next sync starts at once."""
        loop = self._loop
        if loop is None:
            self._sick.setdefault(device, why)
            return
        loop.call_soon_threadsafe(self._mark, device, why)

    def _mark(self, device: str, why: str) -> None:
        if device not in self._sick:
            logger.warning("GPU %s is unhealthy: %s", device, why)
            self._sick[device] = why
            self.wake.set()

    def reading(self) -> readings.NodeReading:
        """All sources together (blocking): the first source to name a resource wins, the others are told off."""
        resources: dict[str, readings.ResourceReading] = {}
        mps = False
        ill = frozenset(self._sick)  # one copy (atomic under the GIL): the loop may add to it meanwhile
        for source in self.sources:
            got = source.read()
            for resource, read in got.resources.items():
                if resource in resources:
                    logger.error("two sources describe %s; keeping the first", resource)
                    continue
                sick = ill & set(read.devices)
                resources[resource] = readings.ResourceReading(
                    read.devices, read.memory_bytes, read.links, read.numa, read.unhealthy | sick
                )
            mps = mps or got.mps_ready
        if self.config.mps_pipe_directory is not None:
            mps = mps or mps_ready(self.config.mps_pipe_directory)
        return readings.NodeReading(resources, mps)

    async def sync(self) -> bool:
        """Read, compare, write what changed. True if a write was made."""
        self._loop = asyncio.get_running_loop()
        reading = await asyncio.to_thread(self.reading)
        if self._carried is None or self.clock() - self._read_at >= self.config.resync:
            self._carried = await self.api.read()
            self._read_at = self.clock()
        if self._last is not None and self._last[0] == reading:
            desired = self._last[1]  # the same facts as last time: the same values (JSON built once)
        else:
            desired = readings.to_annotations(reading)
            self._last = (reading, desired)
        if readings.changes(self._carried, desired) == {}:
            return False
        try:
            self._carried = await self.api.publish(self._carried, desired)
        except publishing.WriteFailed:
            self._carried = None  # read the Node again before the next try
            raise
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Sync every ``interval`` (or at once when a GPU falls ill) until ``stop`` is set."""
        self._loop = asyncio.get_running_loop()
        if self._sick:
            self.wake.set()
        while not stop.is_set():
            try:
                await self.sync()
            except publishing.NodeNotFound as e:
                logger.error("%s", e)
            except (publishing.WriteFailed, rest.ApiError, OSError, ValueError) as e:
                logger.error("node %s: %s", self.api.node, e)
            except Exception as e:  # a source's own error (NVML): keep what is published, try again
                if _is_nvml_error(e):
                    logger.error("node %s: NVML: %s", self.api.node, e)
                else:
                    raise
            await self._pause(stop)

    async def _pause(self, stop: asyncio.Event) -> None:
        """``interval`` seconds, or less: a GPU fell ill (``wake``) or the agent stops."""
        waiting = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiting, timeout=self.config.interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiting:
                task.cancel()
        self.wake.clear()


def _is_nvml_error(e: Exception) -> bool:
    return any(cls.__name__ == "NVMLError" for cls in type(e).__mro__)
