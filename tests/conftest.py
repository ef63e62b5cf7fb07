"""Suite-wide fixtures. Topic folders keep their own conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
async def sandbox(tmp_path: Path):  # -> AsyncIterator[deviceshare.sandbox.Sandbox]
    """A running sandbox cluster (4 shared nodes x 8 nvidia.com/gpu, the repo's CRDs) in this test's loop."""
    from deviceshare.sandbox import Sandbox  # imported here: suites that never use it stay fast

    async with Sandbox(kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=0.01) as running:
        yield running
