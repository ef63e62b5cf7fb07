"""GPU health from NVML's XID events, as the NVIDIA device plugin judges it.

A thread waits on an NVML event set registered for critical XID errors on every GPU. An XID marks its
GPU unhealthy, except the ones NVIDIA's device plugin ignores as application errors that leave the GPU
healthy (13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive
cleanup, 68 video processor exception, 109 context switch timeout; ``--ignore-xids`` adds more). A GPU
that cannot be registered, an event that names no GPU, or a wait that fails for another reason than
its timeout marks the GPUs unhealthy too: the plugin does the same, on the grounds that a node
whose health cannot be watched should not take new work. Unhealthy is sticky until the agent restarts
(after the GPU was reset or replaced), as in the plugin.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger("deviceshare.nodeagent.xids")

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
WAIT_MS = 500  # how long one wait blocks: also how soon stop() takes effect

OnUnhealthy = Callable[[str, str], None]  # (device UUID, why): called from the watcher thread


class XidWatch:
    """Watches XID events in a daemon thread until :meth:`stop`; reports through ``on_unhealthy``."""

    def __init__(self, nvml: Any, on_unhealthy: OnUnhealthy, ignored: Iterable[int] = ()) -> None:
        self.nvml = nvml
        self.on_unhealthy = on_unhealthy
        self.ignored = APPLICATION_XIDS | frozenset(ignored)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: Any = None
        self._uuids: list[str] = []

    def start(self) -> None:
        nvml = self.nvml
        self._events = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError as e:  # lost already: the device reading reports what it can of it
                logger.warning("GPU %d does not answer NVML (%s): its XID events are not watched", index, e)
                continue
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            self._uuids.append(uuid)
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError & supported, self._events)
            except nvml.NVMLError_NotSupported:
                logger.warning("GPU %s reports no XID events: its health is not watched", uuid)
            except nvml.NVMLError as e:
                self.on_unhealthy(uuid, f"its XID events could not be watched: {e}")
        self._thread = threading.Thread(target=self._run, name="xid-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._events is not None:
            try:
                self.nvml.nvmlEventSetFree(self._events)
            except self.nvml.NVMLError as e:
                logger.warning("nvmlEventSetFree: %s", e)
            self._events = None

    def _run(self) -> None:
        nvml = self.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                event = wait(self._events, WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as e:
                for uuid in self._uuids:
                    self.on_unhealthy(uuid, f"waiting for its XID events failed: {e}")
                self._stop.wait(WAIT_MS / 1000)
                continue
            self._handle(event)

    def _handle(self, event: Any) -> None:
        nvml = self.nvml
        if event.eventType != nvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(event.eventData)
        if xid in self.ignored:
            logger.info("XID %d (an application error) ignored", xid)
            return
        try:
            uuid = nvml.nvmlDeviceGetUUID(event.device)
        except nvml.NVMLError as e:
            for known in self._uuids:
                self.on_unhealthy(known, f"XID {xid} on a GPU NVML could not name ({e})")
            return
        self.on_unhealthy(uuid.decode() if isinstance(uuid, bytes) else str(uuid), f"XID {xid}")
