"""An embedded Kubernetes API (built on kmock) with simulated GPU nodes, for tests, demo and benchmarks."""
