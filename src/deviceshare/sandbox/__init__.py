"""An embedded Kubernetes API (built on kmock) with simulated GPU nodes, for tests, demo and benchmarks.

Its libraries (kmock, jsonpatch) are the optional extra ``deviceshare[sandbox]``: the operator and webhook image
installs only what production runs. cel-python, which it also uses, is a main dependency (the operator evaluates
DRA device selectors with it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from deviceshare.errors import ConfigError

if TYPE_CHECKING:
    from deviceshare.sandbox.cluster import Sandbox

__all__ = ["Sandbox", "require"]

# module -> the distribution that provides it, for the message
EXTRA_MODULES = {"kmock": "kmock", "jsonpatch": "jsonpatch"}


def require() -> None:
    """Raise ``ConfigError`` naming the extra when one of the sandbox's libraries is not installed."""
    missing = []
    for module, distribution in EXTRA_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    if missing:
        raise ConfigError(
            f"the sandbox needs the optional extra: pip install 'deviceshare[sandbox]' (missing: {', '.join(missing)})"
        )


def __getattr__(name: str) -> Any:
    # Imported on first use: ``deviceshare sandbox --help`` need not load kmock and the emulator.
    if name == "Sandbox":
        from deviceshare.sandbox.cluster import Sandbox

        return Sandbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
