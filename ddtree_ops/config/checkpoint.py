"""Checkpoint facts: what the target's and the draft's own config files say.

``validate`` used to say ok wherever the truth lived in the checkpoints (block size, context
window, architecture, vocabulary, image processor, size). This module reads those files where
they can be read and checks the deployment against them:

* a local directory on the controller (``ddtree_model.path`` /
  ``ddtree_speculative.draft_model_path`` is an existing directory holding ``config.json``);
* the Hugging Face Hub, only when the operator allows it (``--hub`` or ``DDTREE_HUB=1``):
  ``hf_hub_download`` of the config files only (:data:`FILES`), never weights, within a total
  deadline (:data:`HUB_DEADLINE_S`) for all files of one checkpoint;
* nothing else: a checkpoint that cannot be read gets one ``info`` finding naming why and which
  rules were not checked (:func:`not_read_finding`), never a silent ok.

Every read is bounded: at most :data:`MAX_FILE_BYTES` per file, strict JSON (no ``NaN``,
``Infinity``, duplicate keys), the top level must be an object, nesting is bounded by Python's
parser (a nesting bomb is one finding). A malformed file is one ``error`` finding naming the file
and the problem, never a traceback.

Rules (:data:`CHECKPOINT_RULES`, each names its SGLang source):

* :func:`rule_ckpt_block_size` — DFLASH/DDTREE block size = the draft's own;
  derived when unset (:func:`apply_facts`).
* :func:`rule_ckpt_context_length` — served context <= the draft's (and target's) window.
* :func:`rule_ckpt_draft_arch` — the draft's architecture fits the algorithm.
* :func:`rule_ckpt_vocab` — target and draft share one vocabulary (EAGLE3 ``draft_vocab_size``).
* :func:`rule_ckpt_vision` — warmup uses the image processor's own ``min_pixels``.
* :func:`rule_ckpt_memory` — per-GPU memory estimate (:func:`estimate_memory`).
* :func:`rule_ckpt_draft_weights` — an EAGLE3 draft ships the tensors its config makes SGLang
  load from it (:mod:`.draft_weights`; tensor names only, from the index or the safetensors header).

Over 600 lines: the readers (local, Hub), the strict checks of the three config files and the
rules that hold a deployment to what they say; kept together because each rule quotes the
file and field it reads. The readers are the first candidate for a module of their own.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .._core.bounded import read_at_most
from .._core.strictjson import StrictJSONError, Words, loads
from .draft_weights import (
    BORROWS_MISSING_HEAD,
    EAGLE3_SOURCE,
    SAFETENSORS,
    WeightNamesError,
    eagle3_requirements,
    missing_tensors,
    names_from_index,
    names_from_safetensors,
)
from .errors import Finding, shorten

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
INDEX = "model.safetensors.index.json"
FILES = (CONFIG, PREPROCESSOR, INDEX)
"""The only files ever read from a checkpoint (``config.json`` required, the others optional)."""

MAX_FILE_BYTES = 1 << 20
"""Largest config file read, bytes (1 MiB: the largest public ``config.json`` files are ~10 KiB,
a safetensors index of a 1T-parameter model ~200 KiB)."""

HUB_DEADLINE_S = 20.0
"""Total seconds for the Hub reads of one checkpoint (all its files); past it: not read."""

HUB_RUN_BUDGET_S = 60.0
"""Total seconds of Hub reads in one run (one ``validate`` / ``plan`` / ``render``, or one host's
play task): a fleet of distinct checkpoints cannot wait 20 s each; past it: not read."""

HUB_ENV = "DDTREE_HUB"
"""``DDTREE_HUB=1`` allows Hub reads as ``--hub`` does."""

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
"""A Hugging Face repo id (``org/name`` or ``name``; huggingface_hub ``validate_repo_id``)."""

SPEC = "ddtree_speculative"
MODEL = "ddtree_model"
SRV = "ddtree_server"


class CheckpointFileError(ValueError):
    """A checkpoint file that is not a bounded, strict JSON object (the message says why)."""


@dataclass(frozen=True)
class CheckpointFacts:
    """What one checkpoint's files say, or why they were not read.

    Attributes:
        role: ``model`` (the target) or ``draft``.
        ref: the path or Hub repo id as configured.
        source: ``local`` or ``hub`` when read, else None.
        config: ``config.json`` as a dict, or None when not read.
        preprocessor: ``preprocessor_config.json``, or None (absent or not read).
        weights_bytes: ``model.safetensors.index.json`` ``metadata.total_size``, bytes, or None.
        weight_names: tensor names (``weight_map`` keys of the index, or the header of a single
            ``model.safetensors``), or None when neither was read.
        weight_names_from: the file they came from.
        not_read: why ``config.json`` was not read (None when it was).
        malformed: ``(file, problem)`` for each file present but not a bounded JSON object.
    """

    role: str
    ref: str | None
    source: str | None = None
    config: dict[str, Any] | None = None
    preprocessor: dict[str, Any] | None = None
    weights_bytes: int | None = None
    not_read: str | None = None
    malformed: tuple[tuple[str, str], ...] = ()
    weight_names: tuple[str, ...] | None = None
    weight_names_from: str | None = None

    @property
    def field(self) -> str:
        return f"{MODEL}.path" if self.role == "model" else f"{SPEC}.draft_model_path"


MAX_INT_DIGITS = 30
"""Longest integer literal parsed (a config's largest sizes have < 20 digits; Python refuses
int strings over 4300 digits with a ValueError, and huge ints overflow float arithmetic)."""


_WORDS = Words(
    max_int_digits=MAX_INT_DIGITS,
    long_int=lambda digits: f"holds an integer of {digits} digits (no config value is that large)",
    not_finite=lambda s: f"holds the number {shorten(s, 40)}, which overflows a float",
    constant=lambda name: f"holds {name}, which strict JSON (RFC 8259) does not allow",
    duplicate=lambda k: f"repeats the key {shorten(k, 60)!r} (which one a loader keeps is undefined)",
)
"""A checkpoint file's limits and wording of the strict parser (:mod:`ddtree_ops._core.strictjson`)."""


def parse_json_object(data: bytes, name: str) -> dict[str, Any]:
    """``data`` (one checkpoint file) as a dict.

    Raises:
        CheckpointFileError: over :data:`MAX_FILE_BYTES`, not UTF-8, not strict JSON (NaN,
            Infinity, duplicate keys, syntax), an integer over :data:`MAX_INT_DIGITS` digits, a
            number that overflows a float, nested too deeply, or not an object.
    """
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointFileError(f"is over {MAX_FILE_BYTES // 1024} KiB (no {name} is that large)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFileError(f"is not UTF-8 text (byte {exc.start})") from None
    try:
        value = loads(text, _WORDS)
    except StrictJSONError as exc:
        raise CheckpointFileError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise CheckpointFileError(f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise CheckpointFileError("is nested too deeply to be a config file") from None
    except ValueError as exc:  # e.g. the int-string limit, should a literal slip past the hooks
        raise CheckpointFileError(f"holds a value Python cannot parse ({shorten(str(exc), 80)})") from None
    if not isinstance(value, dict):
        raise CheckpointFileError(f"must be a JSON object, not {type(value).__name__}")
    return value


def read_bounded(path: str) -> bytes:
    """At most :data:`MAX_FILE_BYTES` + 1 bytes of the regular file ``path`` (symlinks followed,
    as Hugging Face cache snapshots are links into ``blobs/``).

    Raises:
        FileNotFoundError: no such file.
        CheckpointFileError: not a regular file (a FIFO, a device, a directory), unreadable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointFileError(f"cannot be opened: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointFileError("is not a regular file")
        return read_at_most(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise CheckpointFileError(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


MAX_SIZE = 1 << 40
"""Exclusive upper bound of every size read from a config (hidden_size, vocab_size, layers,
heads, block_size, ...): the largest public models are < 2**20 on each; a value past it would
overflow the memory estimate's float arithmetic."""

MAX_TOTAL_SIZE = 1 << 50
"""Exclusive upper bound of ``metadata.total_size`` (bytes; 1 PiB)."""

SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "draft_vocab_size", "intermediate_size", "moe_intermediate_size", "num_experts",
               "n_routed_experts", "num_local_experts", "max_position_embeddings", "block_size", "kv_lora_rank")
"""Config sizes the rules and the memory estimate read (top level, ``text_config`` and
``dflash_config``): each, when present and not null, an integer in 1..:data:`MAX_SIZE` - 1."""

LIST_OF_STR_FIELDS = ("architectures", "layer_types")
OBJECT_FIELDS = ("text_config", "dflash_config")
STR_FIELDS = ("torch_dtype", "dtype")


def _shown_value(v: Any) -> str:
    return shorten(repr(v), 60)


def _typename(v: Any) -> str:
    return "null" if v is None else {"bool": "boolean", "str": "string", "dict": "object", "list": "list",
                                     "float": "number"}.get(type(v).__name__, type(v).__name__)


def config_problems(cfg: dict[str, Any]) -> list[str]:
    """What is wrong with the types and ranges of the fields of a ``config.json`` the rules read
    (:data:`SIZE_FIELDS`, :data:`LIST_OF_STR_FIELDS`, :data:`OBJECT_FIELDS`, :data:`STR_FIELDS`),
    one phrase each, e.g. ``has block_size = '16' (a string): an integer 1..2**40-1 expected``.
    A wrong type is never silently skipped: the rule that reads the field would miss it."""
    out: list[str] = []
    scopes: list[tuple[str, dict[str, Any]]] = [("", cfg)]
    for key in OBJECT_FIELDS:
        sub = cfg.get(key)
        if key in cfg and sub is not None and not isinstance(sub, dict):
            out.append(f"has {key} = {_shown_value(sub)} ({_typename(sub)}): an object expected")
        elif isinstance(sub, dict):
            scopes.append((f"{key}.", sub))
    for where, src in scopes:
        for key in SIZE_FIELDS:
            v = src.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                out.append(f"has {where}{key} = {_shown_value(v)} ({_typename(v)}): an integer 1..2**40-1 expected")
            elif not 0 < v < MAX_SIZE:
                out.append(f"has {where}{key} = {shorten(str(v), 40)}: out of range (1..2**40-1)")
        for key in LIST_OF_STR_FIELDS:
            v = src.get(key)
            if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
                out.append(f"has {where}{key} = {_shown_value(v)} ({_typename(v)}): a list of strings expected")
        for key in STR_FIELDS:
            v = src.get(key)
            if v is not None and not isinstance(v, str):
                out.append(f"has {where}{key} = {_shown_value(v)} ({_typename(v)}): a string expected")
    if "tie_word_embeddings" in cfg and not isinstance(cfg["tie_word_embeddings"], (bool, type(None))):
        v = cfg["tie_word_embeddings"]
        out.append(f"has tie_word_embeddings = {_shown_value(v)} ({_typename(v)}): true or false expected")
    return out


def index_problems(index: dict[str, Any]) -> list[str]:
    """What is wrong with ``metadata.total_size`` of a safetensors index (absent is fine)."""
    meta = index.get("metadata")
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return [f"has metadata = {_shown_value(meta)} ({_typename(meta)}): an object expected"]
    size = meta.get("total_size")
    if size is None:
        return []
    if isinstance(size, bool) or not isinstance(size, int):
        return [f"has metadata.total_size = {_shown_value(size)} ({_typename(size)}): an integer of bytes expected"]
    if not 0 < size < MAX_TOTAL_SIZE:
        return [f"has metadata.total_size = {shorten(str(size), 40)}: out of range (1..2**50-1 bytes)"]
    return []


def _total_size(index: dict[str, Any]) -> int | None:
    meta = index.get("metadata")
    size = meta.get("total_size") if isinstance(meta, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and 0 < size < MAX_TOTAL_SIZE else None


def facts_from_files(role: str, ref: str, source: str, files: dict[str, bytes | None]) -> CheckpointFacts:
    """Facts from the raw bytes of :data:`FILES` (None: the file is absent). Never raises."""
    parsed: dict[str, dict[str, Any]] = {}
    malformed: list[tuple[str, str]] = []
    for name in FILES:
        data = files.get(name)
        if data is None:
            continue
        try:
            parsed[name] = parse_json_object(data, name)
        except CheckpointFileError as exc:
            malformed.append((name, str(exc)))
            continue
        check = config_problems if name == CONFIG else index_problems if name == INDEX else None
        malformed.extend((name, why) for why in (check(parsed[name]) if check else []))
    if CONFIG not in parsed:
        why = (f"{CONFIG} is malformed" if any(n == CONFIG for n, _ in malformed)
               else f"no {CONFIG} in the checkpoint")
        return CheckpointFacts(role, ref, source if PREPROCESSOR in parsed else None, None, parsed.get(PREPROCESSOR),
                               not_read=why, malformed=tuple(malformed))
    names = None
    if INDEX in parsed:
        try:
            names = names_from_index(parsed[INDEX])
        except WeightNamesError as exc:
            malformed.append((INDEX, str(exc)))
    return CheckpointFacts(role, ref, source, parsed[CONFIG], parsed.get(PREPROCESSOR),
                           _total_size(parsed[INDEX]) if INDEX in parsed else None, None, tuple(malformed),
                           names, INDEX if names is not None else None)


def read_local(role: str, path: str) -> CheckpointFacts:
    """Facts of a checkpoint directory on the controller (:data:`FILES`, each bounded). Never raises."""
    files: dict[str, bytes | None] = {}
    bad: list[tuple[str, str]] = []
    for name in FILES:
        try:
            files[name] = read_bounded(os.path.join(path, name))
        except FileNotFoundError:
            files[name] = None
        except CheckpointFileError as exc:
            files[name] = None
            bad.append((name, str(exc)))
    facts = facts_from_files(role, path, "local", files)
    if facts.weight_names is None and files.get(INDEX) is None:
        try:  # one-file checkpoint: the tensor names from its header (8-byte length + JSON, bounded)
            facts = replace(facts, weight_names=names_from_safetensors(os.path.join(path, SAFETENSORS),
                                                                       parse_json_object),
                            weight_names_from=SAFETENSORS)
        except FileNotFoundError:
            pass
        except WeightNamesError as exc:
            bad.append((SAFETENSORS, str(exc)))
    if any(n == CONFIG for n, _ in bad):
        facts = replace(facts, not_read=f"{CONFIG} is malformed")
    for name, why in bad:
        facts = _with_malformed(facts, name, why)
    return facts


def _with_malformed(f: CheckpointFacts, name: str, why: str) -> CheckpointFacts:
    return replace(f, malformed=f.malformed + ((name, why),))


HubFetch = Callable[..., Any]
"""``hf_hub_download``'s shape: ``(repo_id=, filename=, revision=, token=, etag_timeout=) -> local path``;
with ``dry_run=True`` an object with ``file_size`` (bytes or None), nothing downloaded."""


def _hub_download() -> HubFetch:
    from huggingface_hub import hf_hub_download

    return hf_hub_download


def read_hub(role: str, repo_id: str, revision: str | None, token: str | None,
             fetch: HubFetch | None = None, deadline_s: float = HUB_DEADLINE_S) -> CheckpointFacts:
    """Facts of a Hub repository: :data:`FILES` through ``hf_hub_download`` (config files only;
    each one's size asked first with ``dry_run=True`` and refused over :data:`MAX_FILE_BYTES`
    before any download; downloads land in the Hugging Face cache, ``HF_HOME``), all within
    ``deadline_s`` seconds in total (a worker thread; past the deadline the checkpoint
    is "not read" and the thread is abandoned as a daemon). Never raises.

    A missing optional file (``EntryNotFoundError``) is absent; any other failure of
    ``config.json`` (no network, 401/404, timeout) makes the checkpoint "not read" with the
    exception's class and first line (the token never appears: it is passed, not printed)."""
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id or repo_id.endswith(".git"):
        return CheckpointFacts(role, repo_id, not_read="not a local directory nor a Hugging Face repo id (org/name)")
    try:
        fetch = fetch or _hub_download()
    except ImportError:
        return CheckpointFacts(
            role, repo_id, not_read="huggingface_hub is not installed (pip install 'ddtree-ops[controller]')"
        )
    result: dict[str, Any] = {}

    def work() -> None:
        files: dict[str, bytes | None] = {}
        for name in FILES:
            try:
                kw = {"repo_id": repo_id, "filename": name, "revision": revision, "token": token,
                      "etag_timeout": min(10.0, deadline_s)}
                info = fetch(**kw, dry_run=True)  # size first: a huge file is refused, not downloaded
                size = getattr(info, "file_size", None)
                if isinstance(size, int) and size > MAX_FILE_BYTES:
                    raise CheckpointFileError(f"is {size} bytes on the Hub, over {MAX_FILE_BYTES // 1024} KiB "
                                              "(not downloaded)")
                files[name] = read_bounded(fetch(**kw))
            except CheckpointFileError as exc:
                result.setdefault("malformed", []).append((name, str(exc)))
            except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many types; each is "not read"
                if name == CONFIG:
                    first = (str(exc).strip().splitlines() or [""])[0]
                    result["error"] = f"{type(exc).__name__}: {shorten(first, 160)}"
                    return
                files[name] = None
        result["files"] = files

    t = threading.Thread(target=work, name=f"hub-read-{role}", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        return CheckpointFacts(role, repo_id, not_read=f"the Hugging Face Hub did not answer within {deadline_s:g} s")
    if "error" in result:
        return CheckpointFacts(role, repo_id, not_read=f"Hub read failed ({result['error']})")
    facts = facts_from_files(role, repo_id, "hub", result.get("files", {}))
    for name, why in result.get("malformed", []):
        facts = _with_malformed(facts, name, why)
    return facts


def hub_allowed(flag: bool) -> bool:
    """Hub reads are allowed by ``--hub`` or ``DDTREE_HUB=1`` (else offline)."""
    return flag or os.environ.get(HUB_ENV, "").strip() == "1"


@dataclass
class CheckpointReader:
    """Reads (and remembers, per run) the facts of each checkpoint a deployment names.

    Attributes:
        hub: Hub reads allowed.
        fetch: ``hf_hub_download`` stand-in (tests); None: the real one.
        deadline_s: total seconds per Hub checkpoint.
        budget_s: total seconds of Hub reads for this reader (:data:`HUB_RUN_BUDGET_S`).
    """

    hub: bool = False
    fetch: HubFetch | None = None
    deadline_s: float = HUB_DEADLINE_S
    budget_s: float = HUB_RUN_BUDGET_S
    _cache: dict[tuple[str, str, str | None], CheckpointFacts] = field(default_factory=dict)
    _spent: float = 0.0

    def read(self, role: str, ref: str | None, revision: str | None, token: str | None) -> CheckpointFacts:
        if not ref:
            return CheckpointFacts(role, ref, not_read="no checkpoint configured")
        key = (role, ref, revision)
        if key not in self._cache:
            self._cache[key] = self._read(role, ref, revision, token)
        return self._cache[key]

    def _read(self, role: str, ref: str, revision: str | None, token: str | None) -> CheckpointFacts:
        if ref.startswith("/"):
            if os.path.isfile(os.path.join(ref, CONFIG)) or os.path.isdir(ref):
                return read_local(role, ref)
            return CheckpointFacts(role, ref, not_read="the path is not on this controller (a path on the host: "
                                                       "the deploy play reads it there)")
        if not self.hub:
            return CheckpointFacts(role, ref, not_read=f"offline (pass --hub or set {HUB_ENV}=1 to read its config "
                                                       "files from the Hugging Face Hub)")
        left = self.budget_s - self._spent
        if left <= 0:
            return CheckpointFacts(role, ref, not_read=f"this run's Hub time ({self.budget_s:g} s in all) is spent")
        import time

        t0 = time.monotonic()
        try:
            return read_hub(role, ref, revision, token, self.fetch, min(self.deadline_s, left))
        finally:
            self._spent += time.monotonic() - t0

    def seed(self, facts: CheckpointFacts, revision: str | None) -> None:
        """Use ``facts`` (e.g. read on the host by the deploy play) for its role and path."""
        self._cache[(facts.role, facts.ref or "", revision)] = facts

    def facts(self, d: Any) -> tuple[CheckpointFacts, CheckpointFacts | None]:
        """(target facts, draft facts or None without speculation) of deployment ``d``."""
        token = d.hf_token.get_secret_value() if d.hf_token is not None else None
        target = self.read("model", d.model.path, getattr(d.model, "revision", None), token)
        draft = None
        if d.speculative.enabled:
            draft = self.read("draft", d.speculative.draft_model_path,
                              getattr(d.speculative, "draft_model_revision", None), token)
        return target, draft


# --- the host's files (the deploy play) ------------------------------------------------------

def host_paths(d: Any) -> list[tuple[str, str, str | None]]:
    """``(role, path, revision)`` of each checkpoint of ``d`` given as an absolute path: those the
    deploy play reads on the host (``roles/ddtree_service``, action ``ddtree_checkpoint``)."""
    out = [("model", d.model.path, d.model.revision)]
    if d.speculative.enabled and d.speculative.draft_model_path:
        out.append(("draft", d.speculative.draft_model_path, d.speculative.draft_model_revision))
    return [x for x in out if x[1].startswith("/")]


def reader_from_host_files(payload: Any, hub: bool = False) -> CheckpointReader:
    """A reader seeded with the files the deploy play read on the host.

    ``payload``: ``{role: {"path": str, "revision": str|None, "files": {name: base64 | None},
    "errors": {name: why}}}`` (``ddtree_checkpoint``'s ``checkpoint_files``). Anything else in it
    (a wrong type, bad base64, an unknown file name) makes that checkpoint "not read". Never raises."""
    import base64
    import binascii

    reader = CheckpointReader(hub=hub)
    if not isinstance(payload, dict):
        return reader
    for role, entry in payload.items():
        if role not in ("model", "draft") or not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        path, rev = entry["path"], entry.get("revision") if isinstance(entry.get("revision"), str) else None
        files: dict[str, bytes | None] = {}
        problem = None
        raw = entry.get("files") if isinstance(entry.get("files"), dict) else {}
        for name in FILES:
            v = raw.get(name)
            if v is None:
                files[name] = None
                continue
            try:
                if not isinstance(v, str) or len(v) > 2 * MAX_FILE_BYTES:
                    raise ValueError
                files[name] = base64.b64decode(v, validate=True)
            except (ValueError, binascii.Error):
                problem = f"the host's {name} did not arrive intact"
        errors = entry.get("errors") if isinstance(entry.get("errors"), dict) else {}
        facts = facts_from_files(role, path, "host", files)
        for name, why in errors.items():
            if name in FILES and isinstance(why, str):
                facts = _with_malformed(facts, name, shorten(why, 200))
                if name == CONFIG:
                    facts = replace(facts, not_read=f"{CONFIG} is malformed")
        if problem:
            facts = replace(facts, config=None, source=None, not_read=problem)
        reader.seed(facts, rev)
    return reader


# --- facts used by the rules ----------------------------------------------------------------

DFLASH_ARCHS = frozenset({"DFlashDraftModel", "DFlashLagunaForCausalLM", "MuseGlimmerAssistantModel",
                          "DFlash2DraftModel", "DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel"})
"""Draft architectures SGLang's DFlash worker loads (``EntryClass`` of ``sglang/srt/models/dflash.py``:
0.5.13.post1 ``DFlashDraftModel``; 0.5.23 adds the others)."""

EAGLE3_ARCHS = frozenset({"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM"})
"""EAGLE-3 heads (``EntryClass`` of ``sglang/srt/models/llama_eagle3.py``, ``kimi_k25_eagle3.py``)."""

EAGLE_ARCHS = frozenset({"LlamaForCausalLMEagle", "Qwen2ForCausalLMEagle", "MistralForCausalLMEagle",
                         "MistralLarge3ForCausalLMEagle"})
"""EAGLE(-1/2) heads (``llama_eagle.py``, ``qwen2_eagle.py``, ``mistral_eagle.py``, ``mistral_large_3_eagle.py``)."""


def _int(cfg: dict[str, Any] | None, *keys: str) -> int | None:
    """The first of ``keys`` that is a positive int in ``cfg`` (or its ``text_config``)."""
    if not cfg:
        return None
    for src in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for k in keys:
            v = src.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_SIZE:
                return v
    return None


def draft_block_size(cfg: dict[str, Any] | None) -> int | None:
    """The block size a DFlash draft records: ``dflash_config.block_size``, else top-level
    ``block_size`` (SGLang ``parse_dflash_draft_config`` in ``sglang/srt/speculative/dflash_utils.py``,
    0.5.13.post1 and 0.5.23: "Keep support for current checkpoints where block_size is top-level";
    z-lab's released drafts write it top-level)."""
    if not cfg:
        return None
    dc = cfg.get("dflash_config")
    v = dc.get("block_size") if isinstance(dc, dict) else None
    if v is None:
        v = cfg.get("block_size")
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_SIZE else None


def processor_min_pixels(pre: dict[str, Any] | None) -> int | None:
    """``min_pixels`` of an image processor config: top-level, else ``size.min_pixels`` /
    ``size.shortest_edge`` (transformers ``Qwen2VLImageProcessor`` reads ``size`` first in 4.5x)."""
    if not pre:
        return None
    size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
    for v in (pre.get("min_pixels"), size.get("min_pixels"), size.get("shortest_edge")):
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 26:
            return v
    return None


def apply_facts(d: Any, target: CheckpointFacts, draft: CheckpointFacts | None) -> tuple[Any, dict[str, Any]]:
    """The deployment with checkpoint-derived values filled in, and where each came from.

    * DFLASH/DDTREE ``block_size`` unset: the draft's own (:func:`draft_block_size`), as SGLang's
      ``_handle_dflash`` infers it (``sglang/srt/arg_groups/speculative_hook.py``).
    * vision: ``vision_min_pixels`` from the processor's ``min_pixels`` (:func:`processor_min_pixels`).

    Returns:
        ``(deployment, sources)``; ``sources`` maps field path -> ``{value, source}``.
    """
    sources: dict[str, Any] = {}
    s = d.speculative
    if s.algorithm in ("DFLASH", "DDTREE") and draft is not None:
        own = draft_block_size(draft.config)
        if s.block_size is None and own is not None:
            d = d.model_copy(update={"speculative": s.model_copy(update={"block_size": own})})
            sources[f"{SPEC}.block_size"] = {"value": own, "source": f"draft {CONFIG} ({draft.source})"}
        elif s.block_size is not None:
            sources[f"{SPEC}.block_size"] = {"value": s.block_size, "source": "inventory"}
    if d.model.vision:
        px = processor_min_pixels(target.preprocessor)
        if px is not None:
            sources[f"{MODEL}.vision_min_pixels"] = {"value": px, "source": f"{PREPROCESSOR} ({target.source})"}
            if px != d.model.vision_min_pixels:
                d = d.model_copy(update={"model": d.model.model_copy(update={"vision_min_pixels": px})})
        else:
            sources[f"{MODEL}.vision_min_pixels"] = {"value": d.model.vision_min_pixels, "source": "inventory"}
    return d, sources


# --- rules ----------------------------------------------------------------------------------

def _err(field: str, value: Any, rule: str, fix: str, source: str = "") -> Finding:
    return Finding("error", field, value, rule, fix, source)


def _warn(field: str, value: Any, rule: str, fix: str, source: str = "") -> Finding:
    return Finding("warning", field, value, rule, fix, source)


@dataclass(frozen=True)
class Facts:
    """The facts one rule sees: target, draft (None without speculation), and the inventory
    deployment before :func:`apply_facts` (to tell a given value from a derived one)."""

    target: CheckpointFacts
    draft: CheckpointFacts | None
    given: Any


def rule_ckpt_block_size(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """DFLASH/DDTREE ``block_size`` equals the draft checkpoint's own block size.

    SGLang sizes the draft forward from ``--speculative-num-draft-tokens`` and only logs
    "DFLASH block size mismatch: using speculative_num_draft_tokens=%s but draft config
    block_size=%s" (``DFlashWorker.__init__``, ``sglang/srt/speculative/dflash_worker.py``
    0.5.13.post1; ``dflash_worker_v2.py`` 0.5.23): the draft then runs at a block size it was not
    trained for."""
    if d.speculative.algorithm not in ("DFLASH", "DDTREE") or f.draft is None:
        return
    own = draft_block_size(f.draft.config)
    given = f.given.speculative.block_size
    if own is not None and given is not None and given != own:
        yield _err(f"{SPEC}.block_size", given,
                   f"the draft checkpoint was trained with block_size {own} ({CONFIG}); SGLang would run it at {given} "
                   "with only a log warning ('DFLASH block size mismatch')",
                   f"set block_size: {own} or remove it (it is then read from the draft)",
                   "sglang/srt/speculative/dflash_worker.py (DFLASH block size mismatch)")


def rule_ckpt_context_length(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """Served ``context_length`` fits the target's and the draft's ``max_position_embeddings``.

    SGLang builds the draft's ModelConfig with the target's context length and raises
    "Target model's context_length (N) is greater than the derived context_length (M)" unless
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, which overrides the draft's window (outputs
    past it are untested) (``ModelConfig._derive_context_length``,
    ``sglang/srt/configs/model_config.py``). The derived length there also reads rope scaling;
    this rule uses ``max_position_embeddings`` (exact for the configs in tests/fixtures)."""
    t_max = _int(f.target.config, "max_position_embeddings")
    served = d.model.context_length or t_max
    override = d.service.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").strip() in ("1", "true", "True")
    src = "sglang/srt/configs/model_config.py ModelConfig._derive_context_length"
    if d.model.context_length and t_max and d.model.context_length > t_max and not override:
        yield _err(f"{MODEL}.context_length", d.model.context_length,
                   f"exceeds the target's max_position_embeddings ({t_max}); SGLang refuses to start",
                   f"lower context_length to <= {t_max}", src)
    if f.draft is None or served is None:
        return
    dr_max = _int(f.draft.config, "max_position_embeddings")
    if dr_max and served > dr_max:
        what = (f"the served context ({served} tokens{'' if d.model.context_length else ', the target default'}) "
                f"exceeds the draft's max_position_embeddings ({dr_max})")
        if override:
            yield _warn(
                f"{MODEL}.context_length",
                d.model.context_length,
                what + "; SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 makes SGLang stretch the draft's window "
                "(acceptance past it is untested)",
                f"set context_length <= {dr_max} to stay in the draft's window",
                src,
            )
        else:
            yield _err(f"{MODEL}.context_length", d.model.context_length,
                       what + "; SGLang refuses to start the draft ('Target model's context_length ... is greater than "
                       "the derived context_length')",
                       f"set context_length: {dr_max} (or lower), or accept the stretch with ddtree_service.env "
                       "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: '1'", src)


def rule_ckpt_draft_arch(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """The draft's ``architectures[0]`` fits the algorithm: a DFlash draft (:data:`DFLASH_ARCHS`)
    for DFLASH/DDTREE, an EAGLE-3 head (:data:`EAGLE3_ARCHS`) for EAGLE3, an EAGLE head or an
    MTP/NextN target-style class for EAGLE. SGLang picks the model class from ``architectures``
    (``sglang/srt/models/registry.py``); a DFlash draft under EAGLE (or the reverse) fails at load."""
    if f.draft is None or not f.draft.config:
        return
    archs = f.draft.config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    alg = d.speculative.algorithm
    field_ = f"{SPEC}.draft_model_path"
    if arch is None:
        yield _warn(field_, d.speculative.draft_model_path, f"the draft's {CONFIG} names no architectures; SGLang "
                    "cannot pick its model class", "check the draft checkpoint")
        return
    src = "sglang/srt/models (EntryClass of dflash.py, llama_eagle3.py, llama_eagle.py)"
    if alg in ("DFLASH", "DDTREE") and arch not in DFLASH_ARCHS:
        yield _err(field_, d.speculative.draft_model_path,
                   f"{alg} needs a DFlash draft ({', '.join(sorted(DFLASH_ARCHS))}); this checkpoint is {arch}",
                   "point draft_model_path at a DFlash draft trained for this target (e.g. z-lab/<target>-DFlash)", src)
    elif alg == "EAGLE3" and arch not in EAGLE3_ARCHS:
        yield _err(field_, d.speculative.draft_model_path,
                   f"EAGLE3 needs an EAGLE-3 head ({', '.join(sorted(EAGLE3_ARCHS))}); this checkpoint is {arch}",
                   "use an EAGLE-3 head for this target, or the algorithm the draft was trained for", src)
    elif alg == "EAGLE" and (arch in DFLASH_ARCHS or arch in EAGLE3_ARCHS):
        yield _err(field_, d.speculative.draft_model_path,
                   f"EAGLE cannot run a {arch} draft ({'DFLASH' if arch in DFLASH_ARCHS else 'EAGLE3'} draft)",
                   f"set algorithm: {'DFLASH' if arch in DFLASH_ARCHS else 'EAGLE3'}", src)


def rule_ckpt_vocab(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """Target and draft share one vocabulary: ``vocab_size`` equal. An EAGLE-3 head may draft
    over a smaller hot vocabulary (``draft_vocab_size``, mapped back through its ``d2t`` table:
    ``LlamaForCausalLMEagle3`` in ``sglang/srt/models/llama_eagle3.py``), which must not exceed
    ``vocab_size``; DFlash drafts use the target's embeddings and LM head (z-lab DFlash)."""
    if f.draft is None:
        return
    tv, dv = _int(f.target.config, "vocab_size"), _int(f.draft.config, "vocab_size")
    if tv and dv and tv != dv:
        yield _err(
            f"{SPEC}.draft_model_path",
            d.speculative.draft_model_path,
            f"the draft's vocab_size ({dv}) differs from the target's ({tv}): it was trained for another tokenizer",
            "use the draft released for this target model",
            "sglang/srt/models/llama_eagle3.py, dflash.py",
        )
    hot = _int(f.draft.config, "draft_vocab_size")
    if hot and dv and hot > dv:
        yield _err(f"{SPEC}.draft_model_path", d.speculative.draft_model_path,
                   f"draft_vocab_size ({hot}) exceeds the draft's vocab_size ({dv})",
                   "the draft checkpoint is inconsistent; use a released one", "sglang/srt/models/llama_eagle3.py")


def rule_ckpt_vision(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """Vision warmup sends an image of the processor's own ``min_pixels`` (read from
    ``preprocessor_config.json``, :func:`apply_facts`): a hand-set value that differs is replaced
    (warning) — smaller is refused by the processor's resize, larger costs warmup time."""
    if not d.model.vision:
        return
    px = processor_min_pixels(f.target.preprocessor)
    given = f.given.model.vision_min_pixels
    if px is not None and given != px and "vision_min_pixels" in f.given.model.model_fields_set:
        yield _warn(f"{MODEL}.vision_min_pixels", given,
                    f"the model's image processor has min_pixels {px} ({PREPROCESSOR}); warmup uses that",
                    "remove vision_min_pixels (it is read from the checkpoint)",
                    "transformers Qwen2VLImageProcessor smart_resize")


# --- memory ----------------------------------------------------------------------------------

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1}


def _dtype_bytes(cfg: dict[str, Any]) -> int:
    v = cfg.get("torch_dtype") or cfg.get("dtype")
    return _DTYPE_BYTES.get(str(v), 2)


def estimate_params(cfg: dict[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its config: embeddings (x2 unless tied) +
    per layer attention (q, o: hidden x heads*head_dim; k, v: hidden x kv_heads*head_dim) + MLP
    (3 x hidden x intermediate; MoE: experts x 3 x hidden x moe_intermediate) + RMSNorm weights
    (two a layer and the final one, hidden each; Qwen3's per-head q/k norms, head_dim each:
    ``Qwen3Attention.q_norm``/``k_norm`` in transformers' ``modeling_qwen3.py``). Exact for the
    published counts of Llama-3.1-8B (8,030,261,248) and Qwen3-8B (8,190,735,360), the Hub's
    safetensors metadata (``tests/test_checkpoint.py``). Biases, routers and vision towers are
    left out (< 1 % of dense LLMs); an EAGLE-3 head's LM head spans ``draft_vocab_size``. None when
    a size is missing."""
    h = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    vocab = _int(cfg, "vocab_size")
    if not (h and layers and heads and vocab):
        return None
    kv = _int(cfg, "num_key_value_heads") or heads
    hd = _int(cfg, "head_dim") or h // heads
    inter = _int(cfg, "intermediate_size") or 4 * h
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts")
    mlp = 3 * h * ((_int(cfg, "moe_intermediate_size") or inter) * experts if experts else inter)
    attn = 2 * h * heads * hd + 2 * h * kv * hd
    tied = cfg.get("tie_word_embeddings") is True
    head = 0 if tied else (_int(cfg, "draft_vocab_size") or vocab) * h  # EAGLE-3: LM head over the hot vocab
    archs = cfg.get("architectures")
    arch = " ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ""
    norms = 2 * h + (2 * hd if arch.startswith("Qwen3") else 0)
    return vocab * h + head + layers * (attn + mlp + norms) + h


def kv_bytes_per_token(cfg: dict[str, Any], tp: int, kv_dtype_bytes: int = 2) -> int | None:
    """KV cache bytes per token on one GPU: layers x ceil(kv_heads / tp) x head_dim x 2 (K and V)
    x dtype bytes (SGLang ``MHATokenToKVPool``: each rank holds its share of KV heads, at least
    one: heads replicate when tp > kv_heads). None for layouts this does not model (MLA
    ``kv_lora_rank``, linear-attention hybrids)."""
    types = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else []
    if "kv_lora_rank" in cfg or any(t != "full_attention" for t in types if isinstance(t, str) and "sliding" not in t):
        return None
    layers, heads, h = _int(cfg, "num_hidden_layers"), _int(cfg, "num_attention_heads"), _int(cfg, "hidden_size")
    if not (layers and heads and h):
        return None
    kv = _int(cfg, "num_key_value_heads") or heads
    hd = _int(cfg, "head_dim") or h // heads
    return layers * -(-kv // tp) * hd * 2 * kv_dtype_bytes


GIB = 1 << 30
WEIGHTS_ERROR = {"index": 0.02, "config": 0.10}
"""Relative error bound of the weight estimate by source: the safetensors index total (exact bytes
on disk; +-2 % for buffers created at load) or parameters counted from the config (+-10 %:
norms, biases, routers, vision towers and quantization scales not counted)."""


def _weights(f: CheckpointFacts) -> tuple[int | None, str]:
    if f.weights_bytes:
        return f.weights_bytes, "index"
    if f.config:
        n = estimate_params(f.config)
        if n:
            return n * _dtype_bytes(f.config), "config"
    return None, ""


def estimate_memory(d: Any, p: Any, target: CheckpointFacts, draft: CheckpointFacts | None) -> dict[str, Any]:
    """Per-GPU memory estimate (bytes, and GiB rounded to 0.01) of one deployment.

    * ``weights_per_gpu``: (target + draft weights) / tp_size, weights from
      ``model.safetensors.index.json`` ``metadata.total_size`` when read, else parameters from
      the config x dtype bytes (:data:`WEIGHTS_ERROR`).
    * ``kv_per_token``: :func:`kv_bytes_per_token` of target + draft (bf16 KV cache).
    * ``kv_needed``: kv_per_token x max_running_requests x served context (the plan's
      max_running_requests; context_length or the target's max_position_embeddings).
    * ``graph_bound``: largest captured graph's tokens x (4 x hidden + 2 x intermediate / tp) x
      dtype bytes (one layer's activations: the graph pool reuses them across layers), at least
      0.5 GiB; a rough bound (SGLang measures its graph memory at startup, outside
      ``mem_fraction_static``), reported but not added to the fit check.
    * ``budget``: mem_fraction_static x the host class' GPU memory; when unset, the fraction the
      pinned release derives (an upper bound: :func:`ddtree_ops.config.derived.derive`, named in
      ``budget_from``), or None where that derivation is not modelled.

    Returns ``{}`` when the target config was not read. ``error_bound`` states the relative error
    of the weight figure; KV is exact for standard MHA/GQA configs.
    """
    if not target.config:
        return {}
    tp = d.server.tp_size
    tw, tsrc = _weights(target)
    dw, dsrc = _weights(draft) if draft is not None else (0, "")
    out: dict[str, Any] = {}
    if tw is not None and dw is not None:
        out["weights_per_gpu"] = (tw + dw) // tp
        worst = max(WEIGHTS_ERROR.get(tsrc, 0.1), WEIGHTS_ERROR.get(dsrc, 0) if draft is not None else 0)
        out["weights_source"] = f"target: {tsrc}" + (f", draft: {dsrc}" if draft is not None else "")
        out["error_bound"] = f"weights +-{round(worst * 100)} %; KV exact for MHA/GQA; graph buffers a rough bound"
    kvt = kv_bytes_per_token(target.config, tp)
    kvd = kv_bytes_per_token(draft.config, tp) if draft is not None and draft.config else 0
    context = d.model.context_length or _int(target.config, "max_position_embeddings")
    if kvt is not None and kvd is not None:
        out["kv_per_token"] = kvt + kvd
        if p.max_running_requests and context:
            out["kv_needed"] = (kvt + kvd) * p.max_running_requests * context
            out["kv_for"] = f"{p.max_running_requests} requests x {context} tokens"
    h = _int(target.config, "hidden_size") or 0
    inter = _int(target.config, "intermediate_size") or 4 * h
    tokens = max(p.max_verify_graph_tokens or 0, p.max_draft_graph_tokens or 0)
    if tokens:
        out["graph_bound"] = max(GIB // 2, tokens * (4 * h + 2 * inter // tp) * _dtype_bytes(target.config))
    hc = d.host_class_def
    frac = d.server.mem_fraction_static
    derived = (getattr(p, "derived", None) or {}).get("mem_fraction_static")
    if frac is None and derived:
        # unset: the fraction the pinned release derives (an upper bound, ddtree_ops/config/derived.py)
        frac = derived["value"]
        out["budget_from"] = f"derived mem_fraction_static <= {frac} ({derived['source']})"
    if hc and frac is not None:
        out["budget"] = int(frac * hc.gpu_memory_gib * GIB)
        out["gpu_memory"] = hc.gpu_memory_gib * GIB
    out["gib"] = {k: round(v / GIB, 2) for k, v in out.items() if isinstance(v, int) and k != "kv_per_token"}
    return out


def rule_ckpt_memory(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """Weights / tp + KV for max_running_requests x context (+ graph buffers) fit in
    ``mem_fraction_static`` x GPU memory (:func:`estimate_memory`). SGLang's static pool is
    weights + KV cache (``ModelRunner.init_memory_pool``, ``sglang/srt/model_executor``); when
    the rest is smaller than the requests need, it admits fewer concurrent requests (or fails
    to start when the weights alone do not fit)."""
    est = estimate_memory(d, p, f.target, f.draft)
    budget, weights = est.get("budget"), est.get("weights_per_gpu")
    if not budget or weights is None:
        return
    from .memory_reserve import reserve

    src = "sglang/srt/model_executor/model_runner.py init_memory_pool"
    if "budget_from" in est:
        src += "; " + est["budget_from"]
    g = est["gib"]
    what = "mem_fraction_static" if "budget_from" not in est else "derived mem_fraction_static (an upper bound)"
    # raising the fraction helps only up to what SGLang needs outside the static pool (activations, graphs)
    r = reserve(d, p)
    frac = d.server.mem_fraction_static
    # unset: the budget is the release's derived bound, and a stated fraction up to the ceiling is the fix
    raisable = r is not None and (frac is None or frac < r.max_fraction)
    raise_frac = f"mem_fraction_static (up to {r.max_fraction})" if raisable and r is not None else ""
    ceiling = "" if raisable or r is None else (
        f"; mem_fraction_static {frac} is already at or above the {r.max_fraction} SGLang itself would use here "
        "(the rest holds activations and CUDA graph buffers)")
    if weights >= budget:
        yield _err(f"{SRV}.mem_fraction_static", d.server.mem_fraction_static,
                   f"weights alone need ~{g['weights_per_gpu']} GiB per GPU (tp {d.server.tp_size}) but "
                   f"{what} leaves {g['budget']} GiB ({est['error_bound']}){ceiling}",
                   f"raise tp_size{' or ' + raise_frac if raise_frac else ''}, or use a smaller model", src)
        return
    need = weights + est.get("kv_needed", 0)
    if "kv_needed" in est and need > budget:
        yield _warn(
            f"{SRV}.mem_fraction_static",
            d.server.mem_fraction_static,
            f"weights ~{g['weights_per_gpu']} GiB + KV for {est['kv_for']} ~{g['kv_needed']} GiB per GPU exceed "
            f"the {g['budget']} GiB {what} leaves: SGLang will admit fewer concurrent full-length "
            f"requests ({est['error_bound']}){ceiling}",
            f"lower max_running_requests or context_length, or raise tp_size{' / ' + raise_frac if raise_frac else ''}",
            src,
        )


CheckpointRule = Callable[[Any, Any, Facts], Iterator[Finding]]
def rule_ckpt_draft_weights(d: Any, p: Any, f: Facts) -> Iterator[Finding]:
    """An EAGLE3 draft ships every tensor its config makes SGLang load from it
    (:func:`~.draft_weights.eagle3_requirements`): a missing ``lm_head.weight`` leaves a random
    head that serves 200 at accept length 1.00 (sgl-project/sglang#27829); a missing ``d2t``
    reads draft ids as target ids. Refused, unless the pinned release borrows the target's head
    for a full-vocabulary draft (:data:`~.draft_weights.BORROWS_MISSING_HEAD`, the change of
    sgl-project/sglang#27908): then a warning."""
    if d.speculative.algorithm != "EAGLE3" or f.draft is None or not f.draft.config:
        return
    field_ = f"{SPEC}.draft_model_path"
    if f.draft.weight_names is None:
        if eagle3_requirements(f.draft.config):
            yield Finding("info", field_, f.draft.ref, "the draft's tensor names were not read (no "
                          f"{INDEX} or single {SAFETENSORS} here): whether it ships the tensors its config needs "
                          "was not checked", f"provide {INDEX} with the checkpoint", EAGLE3_SOURCE)
        return
    version = d.sglang.base_version
    for r in missing_tensors(f.draft.config, f.draft.weight_names):
        borrowed = r.borrowed_when_missing and BORROWS_MISSING_HEAD.get(version, False)
        text = (f"the draft's {f.draft.weight_names_from} lists no {r.name}, yet {r.why}: "
                + ("SGLang " + version + " borrows the target's head instead" if borrowed else
                   f"SGLang {version} would run it with a random {r.name} (serves 200, accept length 1.00)"))
        fix = ("use a draft checkpoint that ships it, or (for a full-vocabulary head meant to share the target's) "
               "remove draft_vocab_size from the draft's config.json so SGLang loads the head from the target")
        yield (_warn if borrowed else _err)(field_, f.draft.ref, text, fix, EAGLE3_SOURCE)


CHECKPOINT_RULES: list[CheckpointRule] = [rule_ckpt_block_size, rule_ckpt_context_length, rule_ckpt_draft_arch,
                                          rule_ckpt_vocab, rule_ckpt_vision, rule_ckpt_memory,
                                          rule_ckpt_draft_weights]
RULES_NEEDING = {"model": "context-length, vocab, vision min_pixels, memory estimate",
                 "draft": "block-size, context-length, draft architecture, vocab, draft tensors"}
"""Which checks need each checkpoint (named in the "not read" info line)."""


def not_read_finding(f: CheckpointFacts) -> Finding:
    """The ``info`` finding for a checkpoint whose config was not read."""
    why = f.not_read or ""
    if why.startswith("offline"):
        fix = f"run with --hub (or {HUB_ENV}=1), or point the path at a local copy"
    elif why.startswith("the path is not on this controller"):
        fix = "nothing: deploy.yml reads it on the host before the service is touched (action ddtree_checkpoint)"
    else:
        fix = "check the path / repo id and its config.json, or pass --hub for a Hub repository"
    return Finding("info", f.field, f.ref, f"checkpoint config not read: {why}; rules "
                   f"{RULES_NEEDING[f.role]} not checked", fix, "")


def checkpoint_findings(d: Any, p: Any, facts: Facts) -> list[Finding]:
    """All findings about the checkpoints: malformed files (error), not read (info), and
    :data:`CHECKPOINT_RULES` (only with the configs they need)."""
    out: list[Finding] = []
    for f in (facts.target, facts.draft):
        if f is None:
            continue
        for name, why in f.malformed:
            out.append(
                Finding(
                    "error",
                    f.field,
                    f.ref,
                    f"the checkpoint's {name} {why}",
                    "fix or re-download the checkpoint (its config files must be strict JSON objects under 1 MiB, "
                    "each field of the type and range its model class reads)",
                    "ddtree_ops/config/checkpoint.py",
                )
            )
        if f.not_read is not None and not (f.malformed and f.not_read.endswith("is malformed")):
            out.append(not_read_finding(f))
    for rule in CHECKPOINT_RULES:
        out.extend(rule(d, p, facts))
    return out


def check_with_checkpoints(d: Any, reader: CheckpointReader) -> tuple[Any, Any, list[Finding]]:
    """Read ``d``'s checkpoints, derive values (:func:`apply_facts`), run the deployment rules on
    the result and the checkpoint rules; return ``(deployment, plan, findings)``. The plan carries
    ``checkpoint``: the derived values with their sources, each checkpoint's read status and the
    memory estimate."""
    from .load import check

    target, draft = reader.facts(d)
    d2, sources = apply_facts(d, target, draft)
    plan, findings = check(d2)
    facts = Facts(target, draft, d)
    ck = [replace(x, host=d.host) for x in checkpoint_findings(d2, plan, facts)]
    # Why a checkpoint was not read is an info finding (validate prints it), not deployment data:
    # plan.json stays byte-identical between `ddtree-ops render` on the controller and the deploy
    # play, which reads the host's files (tests/hosts/test_deploy.py), when neither finds one.
    status = {f.role: ({"read": f.source, "ref": f.ref} if f.not_read is None else {"read": None})
              for f in (target, draft) if f is not None}
    summary = {"derived": sources, "checkpoints": status, "memory": estimate_memory(d2, plan, target, draft)}
    warnings = plan.warnings + [w.message() for w in ck if w.level == "warning"]
    return d2, replace(plan, checkpoint=summary, warnings=warnings), findings + ck


def validate_with_checkpoints(host: str, hostvars: dict[str, Any], reader: CheckpointReader) -> Any:
    """:func:`~.load.validate_hostvars` with the checkpoint facts (:func:`check_with_checkpoints`):
    a :class:`~.load.Validated` whose warnings include the ``info`` findings.

    Raises:
        ConfigError: any deployment or checkpoint rule reports an error.
    """
    from .errors import ConfigError
    from .load import Validated, deployment_from_hostvars

    d, plan, findings = check_with_checkpoints(deployment_from_hostvars(host, hostvars), reader)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise ConfigError(errors)
    return Validated(d, plan, [f for f in findings if f.level != "error"])
