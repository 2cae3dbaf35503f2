"""``python -m shardpipes`` and the ``shardpipes`` console script."""

from __future__ import annotations

import sys

from shardpipes.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
