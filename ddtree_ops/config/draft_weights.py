"""Which tensors an EAGLE3 draft checkpoint must ship, and reading its tensor names (never the data).

A draft whose config asks for its own output head but whose weights lack one starts, captures
CUDA graphs and answers 200 — with a randomly initialised head, so no draft token is ever
accepted (accept length 1.00; sgl-project/sglang#27829, fix proposed in
sgl-project/sglang#27908). The requirements below are read off the EAGLE3 draft models of the
releases in :data:`~.versions.RELEASES` (``sglang/srt/models/llama_eagle3.py``
``LlamaForCausalLMEagle3.__init__`` / ``load_weights`` and ``kimi_k25_eagle3.py``
``Eagle3DeepseekV2ForCausalLM``, 0.5.13.post1, 0.5.17, 0.5.23) and the EAGLE3 branch of the
worker's embed/head sharing (``sglang/srt/speculative/eagle_worker_v2.py``):

* ``embed_tokens``: never needed — the worker always gives an EAGLE3 draft the target's
  embedding (``set_embed``).
* ``lm_head.weight``: needed unless ``tie_word_embeddings`` is true (the head is the shared
  embedding) or ``draft_vocab_size`` is unset (the draft then borrows the target's head:
  ``load_lm_head_from_target``). A draft that sets ``draft_vocab_size`` — even to
  ``vocab_size`` — gets a fresh ``ParallelLMHead`` that only its checkpoint fills;
  ``load_weights`` never reports a tensor it did not receive.
* ``d2t``: needed when ``draft_vocab_size < vocab_size``: it maps draft ids to target ids
  (``hot_token_id``); without it the draft's ids are read as target ids. ``t2d`` is skipped
  by the loader and not needed.

Names come from ``model.safetensors.index.json`` (``weight_map`` keys) or, for a checkpoint
of one file, the header of ``model.safetensors`` (an 8-byte little-endian length, then a JSON
object keyed by tensor name; only that header is read, bounded).
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SAFETENSORS = "model.safetensors"
MAX_HEADER_BYTES = 1 << 20
"""Largest safetensors header read (a draft of a few dozen tensors has a header of a few KiB;
a 1-layer EAGLE3 head's is under 4 KiB)."""

EAGLE3_SOURCE = ("sglang/srt/models/llama_eagle3.py LlamaForCausalLMEagle3 (__init__: load_lm_head_from_target "
                 "only when draft_vocab_size is unset; load_weights: d2t -> hot_token_id), "
                 "sglang/srt/speculative/eagle_worker_v2.py; sgl-project/sglang#27829")

BORROWS_MISSING_HEAD: dict[str, bool] = {
    "0.5.13.post1": False,
    "0.5.17": False,
    "0.5.23": False,
}
"""Whether the release gives a full-vocabulary EAGLE3 draft that ships no ``lm_head`` the
target's head (the change proposed in sgl-project/sglang#27908). None of the releases read so
far does: each sets ``load_lm_head_from_target`` only when ``draft_vocab_size`` is unset. Where
a release does, a missing full-vocabulary head is a warning instead of an error."""


class WeightNamesError(ValueError):
    """A safetensors header or index that does not list tensor names properly (message says why)."""


@dataclass(frozen=True)
class Requirement:
    """One tensor a draft must ship: a name test and why SGLang needs it."""

    name: str
    why: str
    borrowed_when_missing: bool = False  # a release with BORROWS_MISSING_HEAD covers for it

    def present(self, names: Iterable[str]) -> bool:
        if self.name == "d2t":  # SGLang's loader tests `"d2t" in name`
            return any("d2t" in n for n in names)
        return any(n == self.name or n.endswith("." + self.name) for n in names)


def eagle3_requirements(cfg: dict[str, Any]) -> list[Requirement]:
    """Tensors the EAGLE3 draft config ``cfg`` makes SGLang load from the draft checkpoint."""
    out: list[Requirement] = []
    draft_vocab, vocab = cfg.get("draft_vocab_size"), cfg.get("vocab_size")
    if cfg.get("tie_word_embeddings") is True or draft_vocab is None:
        return out
    full = isinstance(vocab, int) and draft_vocab == vocab
    out.append(Requirement(
        "lm_head.weight",
        f"draft_vocab_size is set ({draft_vocab}{' = vocab_size' if full else ''}) and tie_word_embeddings is not "
        "true, so SGLang gives the draft its own output head and fills it only from this checkpoint",
        borrowed_when_missing=full))
    if isinstance(vocab, int) and isinstance(draft_vocab, int) and draft_vocab < vocab:
        out.append(Requirement(
            "d2t", f"draft_vocab_size {draft_vocab} < vocab_size {vocab}: SGLang maps draft ids to target ids with "
            "the checkpoint's d2t tensor"))
    return out


def names_from_index(index: dict[str, Any]) -> tuple[str, ...] | None:
    """``weight_map`` keys of a safetensors index, or None when it has no ``weight_map``.

    Raises:
        WeightNamesError: ``weight_map`` is not an object of name -> file name strings.
    """
    wm = index.get("weight_map")
    if wm is None:
        return None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise WeightNamesError("has a weight_map that is not an object of tensor name -> file name")
    return tuple(wm)


def names_from_safetensors(path: str, parse) -> tuple[str, ...]:
    """Tensor names in the header of the safetensors file ``path`` (only the header is read).

    ``parse`` turns the header bytes into a dict (the strict, bounded JSON reader of
    :func:`ddtree_ops.config.checkpoint.parse_json_object`).

    Raises:
        FileNotFoundError: no such file.
        WeightNamesError: not a regular file, a header length over :data:`MAX_HEADER_BYTES` or
            past the file's end, a header that is not a JSON object of tensor entries.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise WeightNamesError(f"cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WeightNamesError("is not a regular file")
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise WeightNamesError("is shorter than a safetensors header length (8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > st.st_size:
            raise WeightNamesError(f"declares a header of {n} bytes (at most {MAX_HEADER_BYTES} and within the file)")
        data = os.pread(fd, n, 8)
    except OSError as exc:
        raise WeightNamesError(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) != n:
        raise WeightNamesError("ends inside its header")
    try:
        header = parse(data.rstrip(b" "), SAFETENSORS)
    except ValueError as exc:
        raise WeightNamesError(f"header {exc}") from None
    names = tuple(k for k in header if k != "__metadata__")
    if not all(isinstance(header[k], dict) for k in names):
        raise WeightNamesError("header holds an entry that is not a tensor description")
    return names


def missing_tensors(cfg: dict[str, Any], names: Iterable[str]) -> list[Requirement]:
    """The requirements of :func:`eagle3_requirements` that ``names`` do not meet."""
    names = tuple(names)
    return [r for r in eagle3_requirements(cfg) if not r.present(names)]
