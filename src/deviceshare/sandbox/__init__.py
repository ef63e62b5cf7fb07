"""An embedded Kubernetes API (built on kmock) with simulated GPU nodes, for tests, demo and benchmarks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deviceshare.sandbox.cluster import Sandbox

__all__ = ["Sandbox"]


def __getattr__(name: str) -> Any:
    # Imported on first use: ``deviceshare sandbox --help`` need not load kmock and the emulator.
    if name == "Sandbox":
        from deviceshare.sandbox.cluster import Sandbox

        return Sandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
