"""With ``--mps-root``, members of compute/memory shares are wired to the node's MPS daemon (AdmissionReview
in, JSONPatch out): the pipe directory, its /dev/shm and CUDA_MPS_PIPE_DIRECTORY, once; nothing for others."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from deviceshare.api import envnames, names
from deviceshare.webhooks import admission, mpsclients
from tests.webhooks.test_admission import groups, make_review, patch_of, pod

MOUNT = mpsclients.MpsMount("/run/deviceshare/mps")
SHARE = {"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"compute": "500m"}}}


def run(body: dict[str, Any], spec: dict[str, Any], mps: mpsclients.MpsMount | None = MOUNT) -> dict[str, Any]:
    return admission.review(make_review(body), groups(trainer=spec), envnames.EnvNames(),
                            names.DEFAULT_SCHEDULER_NAME, mps)


def _applied(body: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    response = run(body, spec)
    assert response["response"]["allowed"], response
    return jsonpatch.apply_patch(copy.deepcopy(body), patch_of(response))


def test_a_compute_share_member_reaches_the_mps_daemon_and_a_reinvocation_adds_nothing() -> None:
    second = {"name": "b", "image": "x", "env": [{"name": "X", "value": "1"}],
              "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    body = pod(containers=[{"name": "a", "image": "x"}, second],
               initContainers=[{"name": "init", "image": "x"}], volumes=[{"name": "data", "emptyDir": {}}])
    mutated = _applied(body, SHARE)
    spec = mutated["spec"]
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        mpsclients.PIPE_VOLUME: "/run/deviceshare/mps/pipe", mpsclients.SHM_VOLUME: "/run/deviceshare/mps/shm"}
    for container in [*spec["containers"], *spec["initContainers"]]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/run/deviceshare/mps/pipe"] == mpsclients.PIPE_VOLUME
        assert mounts["/dev/shm"] == mpsclients.SHM_VOLUME
        env = {e["name"]: e for e in container["env"]}
        assert env["CUDA_MPS_PIPE_DIRECTORY"]["value"] == "/run/deviceshare/mps/pipe"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env  # the limit, wired as before
    assert patch_of(run(mutated, SHARE)) == []


@pytest.mark.parametrize(("spec", "mps"), [
    ({"resources": {"nvidia.com/gpu": 2}}, MOUNT),  # whole devices: nothing to enforce
    ({"resources": {"gpu.intel.com/i915": 1}, "share": {"gpu.intel.com/i915": {"tiles": 1}}}, MOUNT),
    (SHARE, None),  # no --mps-root: a share is a scheduling promise, as before
])
def test_others_get_no_mps_wiring(spec: dict[str, Any], mps: mpsclients.MpsMount | None) -> None:
    ops = patch_of(run(pod(), spec, mps))
    assert ops and not any("CUDA_MPS_PIPE_DIRECTORY" in str(op) or "deviceshare-mps" in str(op) for op in ops)


@pytest.mark.parametrize(("container", "words"), [
    ({"env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mine"}]}, "sets CUDA_MPS_PIPE_DIRECTORY itself"),
    ({"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}, "mounts its own /dev/shm"),
])
def test_a_member_that_would_slip_past_the_daemon_is_denied(container: dict[str, Any], words: str) -> None:
    response = run(pod(containers=[{"name": "main", "image": "x", **container}]), SHARE)
    assert not response["response"]["allowed"]
    assert words in response["response"]["status"]["message"]
    assert "'main'" in response["response"]["status"]["message"]
