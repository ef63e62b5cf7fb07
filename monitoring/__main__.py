"""``python -m monitoring`` (``make monitoring``): write the dashboards' JSON and monitoring/manifests/."""

from __future__ import annotations

import sys

from monitoring import objects


def main() -> int:
    for path, text in objects.rendered().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
