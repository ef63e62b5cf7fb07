"""Suite-wide fixtures. Topic folders keep their own conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from deviceshare.operator import storage
    from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent

# No per-example deadline and no "too slow" health check: how long an example takes is the machine's
# speed, not a property of the code (issue 21). A test's own @settings still sets its example count.
settings.register_profile("deviceshare", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("deviceshare")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
async def sandbox(tmp_path: Path):  # -> AsyncIterator[deviceshare.sandbox.Sandbox]
    """A running sandbox cluster (4 shared nodes x 8 nvidia.com/gpu, the repo's CRDs) in this test's loop."""
    from deviceshare.sandbox import Sandbox  # imported here: suites that never use it stay fast

    async with Sandbox(kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=0.01) as running:
        yield running


@pytest.fixture
async def api(box: Sandbox) -> AsyncIterator[storage.ClusterApi]:
    """The operator's API client (``storage.ClusterApi``) on the test module's own ``box`` sandbox, closed after."""
    from deviceshare.kube import connecting
    from deviceshare.operator import storage

    cluster_api = storage.ClusterApi(await connecting.api_client(str(box.kubeconfig)))
    yield cluster_api
    await cluster_api.close()
