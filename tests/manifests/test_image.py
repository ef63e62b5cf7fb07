"""The container image recipe: pinned base, non-root, runtime dependencies only.

Docker is not needed to check what a reader of the Dockerfile must be able to rely on.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _base_image() -> str:
    args = dict(rest.split("=", 1) for kw, rest in _instructions() if kw == "ARG" and "=" in rest)
    image = next(rest for kw, rest in _instructions() if kw == "FROM").split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)


def test_base_image_is_pinned_to_a_full_python_version() -> None:
    image = _base_image()
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", image), image


def test_final_stage_runs_deviceshare_as_a_numeric_non_root_user() -> None:
    final = dict(_stages()[-1][1:])
    user = final["USER"].split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user)
    assert final["ENTRYPOINT"] == '["deviceshare"]'
    # uid the manifests run as must be the image's user (runAsNonRoot needs a numeric USER)
    deployment = (ROOT / "manifests" / "base" / "operator.yaml").read_text()
    assert f"runAsUser: {user[0]}" in deployment


def test_final_stage_carries_only_the_built_virtualenv() -> None:
    stages = _stages()
    assert len(stages) >= 2, "multi-stage: the build tools stay in the first stage"
    final_copies = [rest for kw, rest in stages[-1] if kw in {"COPY", "ADD"}]
    assert final_copies and all(c.startswith("--from=") for c in final_copies)
    build_runs = " ".join(rest for kw, rest in stages[0] if kw == "RUN")
    assert "[dev]" not in build_runs and "-e " not in build_runs  # no dev extras, no editable install


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for top-level paths: last matching pattern wins."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_local_state() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = [word for kw, rest in _stages()[0] if kw == "COPY" for word in rest.split()[:-1]]
    assert copied
    for path in copied:
        assert (ROOT / path).exists(), path
        assert not _ignored(path.rstrip("/"), patterns), path
    for local in (".venv", ".git", "manifests/overlays/self-signed/certs/tls.key", "tests", ".sandbox"):
        assert _ignored(local, patterns), local
