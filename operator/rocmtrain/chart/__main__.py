"""`python -m rocmtrain.chart [root]`: write the Helm chart from manifests/ (`make manifests`)."""

from __future__ import annotations

import sys
from pathlib import Path

from rocmtrain.chart import CHART_DIR, write


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else ".")
    write(root)
    print(root / CHART_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
