"""EAGLE3 drafts missing the tensors their config needs are caught from the tensor names alone
(``ddtree_ops/config/draft_weights.py``, ``rule_ckpt_draft_weights``)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from helpers import FIXTURES

from ddtree_ops.config import draft_weights
from ddtree_ops.config.checkpoint import INDEX, CheckpointReader, check_with_checkpoints, read_local
from ddtree_ops.config.load import deployment_from_hostvars

LLAMA31 = FIXTURES / "checkpoints" / "meta-llama--Llama-3.1-8B-Instruct"
EAGLE3_HEAD = FIXTURES / "checkpoints" / "sgl-project--SpecForge-llama3-8B-eagle3"
LAYER = ["midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
         "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "fc.weight", "norm.weight"]


@pytest.fixture
def tmp_path():
    """Scratch space the service sandbox lets a unit read (/dev/shm; the unit's PrivateTmp hides /tmp)."""
    d = Path(tempfile.mkdtemp(prefix="ddtree-draftw-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def draft(tmp: Path, names: list[str] | None, *, single: bool = False, **cfg_over) -> Path:
    """An EAGLE3 head checkpoint: the SpecForge Llama-3.1 head's config with ``cfg_over`` applied,
    and its tensor names in an index (or, ``single``, the header of one model.safetensors)."""
    d = tmp / "draft"
    d.mkdir(exist_ok=True)
    cfg = json.loads((EAGLE3_HEAD / "config.json").read_text())
    for k, v in cfg_over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    if names is not None and not single:
        (d / INDEX).write_text(json.dumps({"metadata": {"total_size": 1000}, "weight_map": {
            n: "model.safetensors" for n in names}}))
    elif names is not None:
        header = json.dumps({"__metadata__": {"format": "pt"},
                             **{n: {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]} for n in names}}).encode()
        header += b" " * (-len(header) % 8)
        (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    return d


def run(tmp: Path, d: Path, version: str = "0.5.23"):
    target = tmp / "target"
    if not target.exists():
        shutil.copytree(LLAMA31, target)
    hv = {"ddtree_host_class": "h200x1", "ddtree_sglang": {"source": "pypi", "version": version},
          "ddtree_model": {"path": str(target)},
          "ddtree_speculative": {"algorithm": "EAGLE3", "draft_model_path": str(d), "num_steps": 3, "topk": 1},
          "ddtree_server": {"tp_size": 1, "max_running_requests": 16}}
    return check_with_checkpoints(deployment_from_hostvars("h1", hv), CheckpointReader())[2]


def about_tensors(findings) -> list:
    return [f for f in findings if f.field == "ddtree_speculative.draft_model_path" and "lists no" in f.rule]


def test_full_vocab_head_without_lm_head_is_refused(tmp_path):
    """sgl-project/sglang#27829: draft_vocab_size == vocab_size, untied, no lm_head.weight in the
    index: SGLang keeps a random head (200, accept length 1.00)."""
    d = draft(tmp_path, LAYER + ["d2t", "t2d"], draft_vocab_size=128256)
    [f] = about_tensors(run(tmp_path, d))
    assert f.level == "error" and f.value == str(d)
    assert "lm_head.weight" in f.rule and "accept length 1.00" in f.rule and INDEX in f.rule
    assert "sgl-project/sglang#27829" in f.source and "llama_eagle3.py" in f.source
    assert "draft_vocab_size" in f.fix


@pytest.mark.parametrize("version", sorted(draft_weights.BORROWS_MISSING_HEAD))
def test_single_file_header_is_read_too(tmp_path, version):
    d = draft(tmp_path, LAYER, single=True, draft_vocab_size=128256)
    facts = read_local("draft", str(d))
    assert facts.weight_names_from == "model.safetensors" and "fc.weight" in facts.weight_names
    [f] = about_tensors(run(tmp_path, d, version))
    assert f.level == "error" and "model.safetensors lists no lm_head.weight" in f.rule and version in f.rule


def test_hot_vocab_head_without_d2t_is_refused(tmp_path):
    """A draft over a smaller hot vocabulary (32000 of 128256) that ships its head but no d2t map."""
    d = draft(tmp_path, LAYER + ["lm_head.weight", "t2d"])
    [f] = about_tensors(run(tmp_path, d))
    assert f.level == "error" and "no d2t" in f.rule and "32000 < vocab_size 128256" in f.rule


@pytest.mark.parametrize("names, over", [
    (LAYER + ["lm_head.weight", "d2t", "t2d"], {}),                         # the SpecForge head as released
    (LAYER + ["lm_head.weight"], {"draft_vocab_size": 128256}),              # full vocab, own head
    (LAYER, {"draft_vocab_size": None}),                                     # head borrowed from the target
    (LAYER, {"draft_vocab_size": 128256, "tie_word_embeddings": True}),      # head = the shared embedding
    (LAYER + ["model.lm_head.weight", "d2t"], {}),                           # prefixed names count
])
def test_complete_drafts_pass(tmp_path, names, over):
    assert about_tensors(run(tmp_path, draft(tmp_path, names, **over))) == []


def test_a_release_that_borrows_the_head_warns(tmp_path, monkeypatch):
    """Where the pinned release borrows the target's head for a full-vocabulary draft without
    one (the change of sgl-project/sglang#27908), the same draft is a warning; a missing d2t
    is still refused."""
    monkeypatch.setitem(draft_weights.BORROWS_MISSING_HEAD, "0.5.23", True)
    [f] = about_tensors(run(tmp_path, draft(tmp_path, LAYER, draft_vocab_size=128256)))
    assert f.level == "warning" and "borrows the target's head" in f.rule
    shutil.rmtree(tmp_path / "draft")
    levels = sorted(f.level for f in about_tensors(run(tmp_path, draft(tmp_path, LAYER))))
    assert levels == ["error", "error"]  # own hot-vocab head and d2t: nothing to borrow


def test_names_not_read_is_said(tmp_path):
    d = draft(tmp_path, None)
    infos = [f for f in run(tmp_path, d) if f.level == "info" and "tensor names were not read" in f.rule]
    assert len(infos) == 1 and infos[0].value == str(d)


@pytest.mark.parametrize("blob, why", [
    (struct.pack("<Q", 1 << 40) + b"{}", "declares a header of"),
    (struct.pack("<Q", 64) + b"{}", "declares a header of"),          # past the file's end
    (b"\1\2\3", "shorter than a safetensors header length"),
    (struct.pack("<Q", 8) + b"[1, 2]  ", "must be a JSON object"),
    (struct.pack("<Q", 16) + b'{"a": 1, "a": 2}', "repeats the key"),
    (struct.pack("<Q", 8) + b'{"x": 1}', "not a tensor description"),
])
def test_malformed_headers_are_refused_with_the_reason(tmp_path, blob, why):
    d = draft(tmp_path, None)
    (d / "model.safetensors").write_bytes(blob)
    facts = read_local("draft", str(d))
    assert facts.weight_names is None
    assert any(n == "model.safetensors" and why in w for n, w in facts.malformed), facts.malformed


def test_index_weight_map_must_name_files(tmp_path):
    d = draft(tmp_path, None)
    (d / INDEX).write_text(json.dumps({"weight_map": {"lm_head.weight": 3}}))
    facts = read_local("draft", str(d))
    assert facts.weight_names is None and any(n == INDEX and "weight_map" in w for n, w in facts.malformed)
