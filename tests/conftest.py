"""Suite-wide fixtures. Topic folders keep their own conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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
