"""Run ``iotgw`` as if some packages were not installed: ``python -m tests.without_packages
tensorflow,sklearn -- serve ...``.

A ``None`` entry in ``sys.modules`` is the interpreter's own way to say that a module cannot be
imported: ``import tensorflow`` then raises ``ModuleNotFoundError`` and
``importlib.util.find_spec("tensorflow")`` answers None, exactly as in an environment that never
installed it. It is cheaper than a fresh virtual environment per test and checks the same code
paths (every import of the hidden package, at start and on first use).
"""

from __future__ import annotations

import sys


def hide(packages: list[str]) -> None:
    for name in packages:
        sys.modules[name] = None  # type: ignore[assignment]  # the documented import blocker


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python -m tests.without_packages PKG[,PKG...] -- IOTGW-ARGS", file=sys.stderr)
        return 2
    split = argv.index("--")
    hide([p for spec in argv[:split] for p in spec.split(",") if p])
    from gateway.cli import main as iotgw

    return iotgw(argv[split + 1 :])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
