"""The CLI is tested against a sandbox with the real operator placing groups (tests/operator's fixtures)."""

from tests.operator.conftest import cluster, kube, operator, sandbox_options

__all__ = ["cluster", "kube", "operator", "sandbox_options"]
