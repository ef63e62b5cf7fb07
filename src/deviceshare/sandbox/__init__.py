"""An embedded Kubernetes API (built on kmock) with simulated GPU nodes, for tests, demo and benchmarks."""

from deviceshare.sandbox.cluster import Sandbox

__all__ = ["Sandbox"]
