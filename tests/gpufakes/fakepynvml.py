"""``pynvml`` for the rehearsal: a module whose every name is the fake NVML's (one H200-like GPU)."""

from typing import Any

from tests.gpufakes import H200_VM
from tests.nodeagent import fakenvml

_NVML = fakenvml.FakeNvml(H200_VM)


def __getattr__(name: str) -> Any:
    return getattr(_NVML, name)
