"""What a member of an MPS-enforced share needs to reach the node's MPS control daemon (CONTRACT §9).

An MPS client finds the daemon through ``CUDA_MPS_PIPE_DIRECTORY`` and shares ``/dev/shm`` with it, as
NVIDIA's device plugin arranges in its MPS mode (``internal/plugin/mps.go``: the pipe directory and the
daemon's shm mounted into the container, the env var pointing at the pipe). The MPS overlay
(``manifests/overlays/mps``) runs the daemon with its pipe, log and shm directories under one host root;
with ``--mps-root`` the webhook gives every container of a pod whose group takes a compute or memory share
of an NVIDIA device: the pipe directory (a hostPath of type Directory, so a node without the daemon
says so when the pod starts), the shm directory at ``/dev/shm``, and the env var.

Pure, like :mod:`admission`: the pod in, JSONPatch operations (or a denial) out. A pod that points
``CUDA_MPS_PIPE_DIRECTORY`` elsewhere, or mounts its own ``/dev/shm``, would leave the daemon's limits
behind (a share that is no longer enforced), so it is denied with a message saying which container.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
PIPE_VOLUME = "deviceshare-mps-pipe"
SHM_VOLUME = "deviceshare-mps-shm"
SHM_PATH = "/dev/shm"
DEFAULT_ROOT = "/run/deviceshare/mps"


@dataclass(frozen=True)
class MpsMount:
    """The MPS daemon's host root: ``<root>/pipe`` (control pipe), ``<root>/shm``, ``<root>/log``."""

    root: str = DEFAULT_ROOT

    @property
    def pipe(self) -> str:
        return f"{self.root.rstrip('/')}/pipe"

    @property
    def shm(self) -> str:
        return f"{self.root.rstrip('/')}/shm"

    def volumes(self) -> list[dict[str, Any]]:
        return [
            {"name": PIPE_VOLUME, "hostPath": {"path": self.pipe, "type": "Directory"}},
            {"name": SHM_VOLUME, "hostPath": {"path": self.shm, "type": "Directory"}},
        ]

    def mounts(self) -> list[dict[str, Any]]:
        return [{"name": PIPE_VOLUME, "mountPath": self.pipe}, {"name": SHM_VOLUME, "mountPath": SHM_PATH}]


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for list_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(list_name) or []):
            yield list_name, index, container


def problem(pod: Mapping[str, Any], mount: MpsMount) -> str | None:
    """Why the pod cannot be an MPS client as it stands (a denial message), or None."""
    spec = pod.get("spec") or {}
    for _, _, container in _containers(spec):
        name = container.get("name", "?")
        for entry in container.get("env") or []:
            if entry.get("name") == PIPE_ENV and entry != {"name": PIPE_ENV, "value": mount.pipe}:
                return (f"container {name!r} sets {PIPE_ENV} itself; its group's share is enforced by the node's "
                        f"MPS daemon, whose pipe directory deviceshare sets ({mount.pipe}): remove it")
        for volume_mount in container.get("volumeMounts") or []:
            path = str(volume_mount.get("mountPath", "")).rstrip("/")
            if path in (SHM_PATH, mount.pipe) and volume_mount.get("name") not in (PIPE_VOLUME, SHM_VOLUME):
                return (f"container {name!r} mounts its own {path}; an MPS client shares {SHM_PATH} and the pipe "
                        "directory with the node's MPS daemon (deviceshare mounts both): remove that mount")
    return None


def patch(pod: Mapping[str, Any], mount: MpsMount, pointer: Any) -> Iterator[dict[str, Any]]:
    """The operations that add what is missing. Runs after the visibility patch, which leaves every
    container with an ``env`` list, so env entries are appended; reinvoked, it adds nothing."""
    spec = pod.get("spec") or {}
    volumes = spec.get("volumes") or []
    have = {v.get("name") for v in volumes}
    missing = [v for v in mount.volumes() if v["name"] not in have]
    if missing and not volumes:
        yield {"op": "add", "path": pointer("spec", "volumes"), "value": missing}
    else:
        for volume in missing:
            yield {"op": "add", "path": pointer("spec", "volumes", "-"), "value": volume}
    for list_name, index, container in _containers(spec):
        mounted = container.get("volumeMounts") or []
        names_ = {m.get("name") for m in mounted}
        wanted = [m for m in mount.mounts() if m["name"] not in names_]
        if wanted and not mounted:
            yield {"op": "add", "path": pointer("spec", list_name, index, "volumeMounts"), "value": wanted}
        else:
            for m in wanted:
                yield {"op": "add", "path": pointer("spec", list_name, index, "volumeMounts", "-"), "value": m}
        if not any(e.get("name") == PIPE_ENV for e in container.get("env") or []):
            yield {"op": "add", "path": pointer("spec", list_name, index, "env", "-"),
                   "value": {"name": PIPE_ENV, "value": mount.pipe}}
