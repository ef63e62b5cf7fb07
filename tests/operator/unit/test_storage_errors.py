"""storage.ClusterApi turns every API failure into an error by intent, once, and hands back parsed records."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from deviceshare.api import names
from deviceshare.kube import rest
from deviceshare.operator import state, storage

GROUP = {
    "metadata": {"namespace": "ns", "name": "g", "uid": "u", "resourceVersion": "7", "generation": 2,
                 "finalizers": [names.GROUP_FINALIZER]},
    "spec": {"resources": {"nvidia.com/gpu": 1}},
    "status": {"phase": "Bound", "nodeName": "n1", "allocatedDevices": {"nvidia.com/gpu": ["0"]}},
}


def api_answering(monkeypatch: pytest.MonkeyPatch, answer: Any) -> storage.ClusterApi:
    """A ClusterApi whose every request gets ``answer`` (raised if it is an exception)."""
    async def call(*args: Any, **kwargs: Any) -> Any:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(rest, "call", call)
    return storage.ClusterApi(api_client=None)  # type: ignore[arg-type]  # never reached: rest.call is replaced


@pytest.mark.parametrize(
    ("failure", "error", "delay"),
    [
        pytest.param(rest.ApiError(409, "conflict"), storage.Conflict, None, id="409"),
        pytest.param(rest.ApiError(404, "not found"), storage.Gone, None, id="404"),
        pytest.param(rest.ApiError(403, "forbidden"), storage.Invalid, None, id="403"),
        pytest.param(rest.ApiError(422, "invalid"), storage.Invalid, None, id="422"),
        pytest.param(rest.ApiError(429, "slow down", {"Retry-After": "7"}), storage.RetryLater, 7.0,
                     id="429 with Retry-After"),
        pytest.param(rest.ApiError(429, "slow down", {"Retry-After": "soon"}), storage.RetryLater, 1.0,
                     id="429 with an unreadable Retry-After"),
        pytest.param(rest.ApiError(500, "boom"), storage.RetryLater, 1.0, id="500"),
        pytest.param(aiohttp.ClientConnectionError("reset"), storage.RetryLater, 1.0, id="connection dropped"),
        pytest.param(TimeoutError(), storage.RetryLater, 1.0, id="timeout"),
    ],
)
async def test_failures_become_errors_by_intent(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, error: type[Exception], delay: float | None
) -> None:
    api = api_answering(monkeypatch, failure)
    with pytest.raises(error) as raised:
        await api.patch_group_status(("ns", "g"), {"phase": "Bound"})
    assert "patch status of shareddevicegroup ns/g" in str(raised.value)  # says which request failed
    if delay is not None:
        assert isinstance(raised.value, storage.RetryLater) and raised.value.delay == delay


async def test_group_writes_and_reads_answer_with_the_parsed_record(monkeypatch: pytest.MonkeyPatch) -> None:
    api = api_answering(monkeypatch, GROUP)
    expected = state.group_record(GROUP)
    assert await api.patch_group_status(("ns", "g"), {"phase": "Bound"}, resource_version="6") == expected
    assert await api.set_group_finalizers(("ns", "g"), [names.GROUP_FINALIZER], resource_version="6") == expected
    assert await api.read_group(("ns", "g")) == expected
    assert await api.read_group_if_exists(("ns", "g")) == expected


async def test_a_missing_group_reads_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    api = api_answering(monkeypatch, rest.ApiError(404, "not found"))
    assert await api.read_group_if_exists(("ns", "g")) is None
    with pytest.raises(storage.Gone):
        await api.read_group(("ns", "g"))
