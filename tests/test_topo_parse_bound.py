"""``nvidia-smi topo -m`` is parsed in time linear in its text and bounded
(:func:`ddtree_ops.host.gpu_facts.parse_topo`): a crafted matrix (3.9 MB, thousands of GPUs) is
refused at once instead of costing half a minute of CPU outside every deadline, and the largest
matrix one host could print still parses quickly."""

from __future__ import annotations

import time

import pytest

from ddtree_ops.host import gpu_facts as gf


def _matrix(n: int, nics: int = 0) -> str:
    head = "\t" + "\t".join([f"GPU{i}" for i in range(n)] + [f"NIC{k}" for k in range(nics)]) + "\tCPU Affinity"
    rows = ["\t".join([f"GPU{i}", *("X" if i == j else "NV18" for j in range(n)), *("SYS",) * nics, "0-1"])
            for i in range(n)]
    return "\n".join([head, *rows, "", "Legend:", "  X    = Self"]) + "\n"


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def test_the_crafted_matrix_is_refused_at_once():
    text = _matrix(1400)  # ~3.9 MB, the size that took 28.8 s of CPU
    assert len(text) > 3_800_000
    with pytest.raises(gf.FactsError, match="over"):
        assert _cpu(lambda: gf.parse_topo(text)) < 0.5


@pytest.mark.parametrize("n", [300, 257])
def test_more_gpus_than_one_host_has_are_refused(n):
    with pytest.raises(gf.FactsError, match=f"names {n} GPUs, over {gf.MAX_TOPO_GPUS}"):
        gf.parse_topo(_matrix(n)[:gf.MAX_TOPO_BYTES])


def test_the_largest_accepted_matrix_parses_in_linear_time():
    text = _matrix(gf.MAX_TOPO_GPUS)
    assert len(text) <= gf.MAX_TOPO_BYTES
    took = _cpu(lambda: gf.parse_topo(text))
    topo = gf.parse_topo(text)
    assert len(topo.links) == gf.MAX_TOPO_GPUS * (gf.MAX_TOPO_GPUS - 1) and topo.kinds() == {"NV"}
    assert took < 1.0, took


def test_a_header_of_many_nic_columns_is_linear():
    """A wide header (NIC columns) under the byte cap: every column looked up once, not per cell."""
    text = _matrix(8, nics=20_000)
    assert len(text) <= gf.MAX_TOPO_BYTES
    assert _cpu(lambda: gf.parse_topo(text)) < 1.0
