"""``python -m ddtree_ops.sim ARGV...``: the SGLang SIMULATOR (a test double, NOT SGLang).

Behaves like ``python -m sglang.launch_server ARGV...`` for CI and demos without GPUs.
"""

from __future__ import annotations

import sys

from ddtree_ops.sim.server import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
