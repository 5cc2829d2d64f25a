"""``ddtree-ops diagnose`` by kind: CUDA graph capture failures, kernel Xid lines, a missing nvidia_uvm,
the batching crash of abandoned /health probes, the kernel journal ``--unit`` reads, and the
false positives a signature must never produce (our own install paths and names, a plan without
speculative decoding, the real healthy SGLang 0.5.17 logs in ``tests/fixtures/gpu/``).

Where each recorded-shape line comes from:

* capture failure: sgl-project/sglang#18596 (sm_120: ``RuntimeError: Runtime check failed at
  .../kvcache.cuh:196: CUDA error: invalid resource handle`` then ``Exception: Capture cuda graph
  failed`` during ``init_device_graphs``); the ``Capture ... CUDA graph begin`` / ``Capturing batches
  (bs=N avail_mem=...)`` / ``Capturing num tokens (num_tokens=N ...)`` lines and the ``Fail when using
  backend: breakable for prefill runner.`` hint are SGLang 0.5.17's own (the real H200 log
  ``tests/fixtures/gpu/acceptance-sglang-0.5.17-h200-2026-12-02/server-DFLASH-30002.log.gz`` and
  ``sglang/srt/model_executor/runner_backend_utils`` of the 0.5.17 wheel);
* Xid lines: NVIDIA/open-gpu-kernel-modules#1151 (``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off
  the bus.``), stas00/ml-engineering's NVIDIA debug notes (``Xid (PCI:0000:10:1c): 63, pid=1896, Row
  Remapper: ...``), the NVIDIA developer forum report of Xid 62/154 on driver 595 (``154, GPU recovery
  action changed from 0x0 (None) to 0x1 (GPU Reset Required)``), a pre-``PCI:`` line (``Xid
  (0000:01:00): 3, ...``); the meanings and actions are NVIDIA's Xid catalog's (the rows past the
  page's opening read from NVIDIA/NVSentinel's machine-readable copy of its Mnemonic and Immediate
  Action columns); the 109/43/61/145/160 lines are written in the driver's shape for those rows;
* nvidia_uvm: NVIDIA/nvidia-docker#139 and torch's ``CUDA unknown error - this may be due to an
  incorrectly set up environment`` text (cudaErrorUnknown at CUDA init);
* ``q.shape[0] (1) does not match qo_indptr[-1] (5)``: sgl-project/sglang#35884 / PR #35896.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path

import pytest
from helpers import FIXTURES, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.host import diagnose as dg

GPU = FIXTURES / "gpu"
IMA = "RuntimeError: CUDA error: an illegal memory access was encountered"
SPEC_OFF = dg.PlanFacts(algorithm="none", given=True, unit="ddtree-sglang.service")


def run(lines: list[str], plan: dg.PlanFacts | None = None, origin: str = "") -> dict[str, dg.Finding]:
    return {f.name: f for f in dg.diagnose(dg.split_lines("\n".join(lines).encode()), plan, origin)}


def cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(["diagnose", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def plain_plan() -> dg.PlanFacts:
    """The plan.json of a deployment without speculative decoding, rendered by the real pipeline."""
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render.files import plan_document

    hv = base_hostvars()
    hv.pop("ddtree_accepted_risks")
    hv.update(ddtree_host_class="h200x1", ddtree_speculative={"algorithm": "none"},
              ddtree_sglang={"version": "0.5.17"}, ddtree_server=dict(hv["ddtree_server"], tp_size=1))
    facts = dg.plan_facts(plan_document(validate_hostvars("h200-01", hv)))
    assert facts.algorithm == "none"
    return facts


# ------------------------------------------------------------------ our own paths and names are no evidence

OWN_PATH_MISMATCH = [  # a non-speculative server installed by ddtree-ops: every path holds "ddtree"
    "[2026-12-02 01:00:00] server_args=ServerArgs(model_path='/opt/ddtree-ops/models/llama', tokenizer_path="
    "'/opt/ddtree-ops/models/llama', cuda_graph_max_bs=16, speculative_algorithm=None, "
    "speculative_draft_model_path=None, speculative_num_draft_tokens=None)",
    "[2026-12-02 01:00:30] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8]",
    "[2026-12-02 01:00:33] Capture target decode CUDA graph end. elapsed=2.10 s, mem usage=0.30 GB.",
    "[2026-12-02 01:01:00] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/ddtree-ops/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2736, '
    "in run_scheduler_process",
    '  File "/opt/ddtree-ops/venv/lib/python3.12/site-packages/sglang/srt/model_executor/runner/'
    'decode_cuda_graph_runner.py", line 801, in replay',
    "RuntimeError: The size of tensor a (8) must match the size of tensor b (16) at non-singleton dimension 0",
    "ddtree-sglang.service: Main process exited, code=exited, status=1/FAILURE",
]


def test_a_plain_deployments_mismatch_is_not_blamed_on_speculative_decoding(plain_plan) -> None:
    """The reported false positive: graphs on, no speculative decoding, our install path everywhere."""
    assert run(OWN_PATH_MISMATCH, plain_plan) == {}
    assert run(OWN_PATH_MISMATCH) == {}  # without the plan too: /opt/ddtree-ops is no speculative frame


def test_our_unit_name_near_a_replay_fault_is_no_speculative_context(plain_plan) -> None:
    log = ["[2026-12-02 01:00:00] Decode batch, #running-req: 4, cuda graph: True",
           "Dec 02 01:00:01 h200-01 systemd[1]: Started ddtree-sglang.service - SGLang (ddtree-ops).",
           '  File "/opt/ddtree-ops/venv/lib/python3.12/site-packages/ddtree_ops/ops/warmup.py", line 10, in verify',
           IMA]
    assert list(run(log)) == ["illegal-memory-access"]  # phase unknown, no speculative decoding claimed
    assert list(run(log, plain_plan)) == ["illegal-memory-access"]


def test_upstream_speculative_frames_and_arguments_still_count() -> None:
    """What is SGLang's stays evidence: its speculative modules under site-packages, and a set
    speculative_algorithm in its server_args dump."""
    frames = [line.replace("managers/scheduler.py", "speculative/eagle_worker.py") for line in OWN_PATH_MISMATCH]
    assert "graph-size-mismatch" in run(frames)
    dump = [OWN_PATH_MISMATCH[0].replace("speculative_algorithm=None", "speculative_algorithm='EAGLE'"),
            *OWN_PATH_MISMATCH[1:]]
    assert "graph-size-mismatch" in run(dump)
    assert dg.evidence(OWN_PATH_MISMATCH[0]) == ""
    assert dg.evidence("/usr/lib/python3/dist-packages/sglang/srt/speculative/ddtree_worker.py").strip() == \
        "sglang/srt/speculative/ddtree_worker.py"
    assert "ddtree" not in dg.evidence("journalctl -u ddtree-sglang.service; /etc/ddtree-ops/x/plan.json ddtree_ops")


def test_the_plan_without_speculation_silences_every_draft_verify_signature(plain_plan) -> None:
    sampler = ['  File "/v/site-packages/sglang/srt/speculative/dflash_worker.py", line 9, in stage_sampling_params',
               "RuntimeError: The size of tensor a (16) must match the size of tensor b (17)"]
    assert run(sampler) and run(sampler, plain_plan) == {}
    replay = ['  File "/v/site-packages/sglang/srt/speculative/eagle_worker.py", line 9, in forward_batch_generation',
              '  File "/v/site-packages/sglang/srt/model_executor/cuda_graph_runner.py", line 9, in replay', IMA]
    assert list(run(replay)) == ["illegal-memory-access-replay"]
    assert list(run(replay, plain_plan)) == ["illegal-memory-access"]


REAL_HEALTHY = sorted([*GPU.glob("sglang-0.5.17-h200-2026-12-01/*/server-*.log"),
                       *GPU.glob("acceptance-sglang-0.5.17-h200-2026-12-02/**/server-*.log.gz")])


@pytest.mark.parametrize("path", REAL_HEALTHY, ids=lambda p: str(p.relative_to(GPU)))
def test_real_healthy_sglang_logs_give_no_finding(path: Path, plain_plan) -> None:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = dg.split_lines(data)
    assert len(lines) > 50
    for plan in (None, plain_plan if "NONE" in path.name else None):
        found = dg.diagnose(lines, plan)
        assert found == [], [f.message() for f in found]


def test_real_healthy_logs_are_all_there() -> None:
    assert len(REAL_HEALTHY) >= 6


# ------------------------------------------------------------------ CUDA graph capture failed


def test_sm120_pdl_capture_failure_names_phase_size_and_the_pdl_fix() -> None:
    """sgl-project/sglang#18596's shape: the error line, then the bare ``Exception: Capture cuda graph failed``."""
    log = ["[2026-02-11 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=28 GB",
           "Capturing batches (bs=8 avail_mem=28.00 GB):   0%|          | 0/8 [00:00<?, ?it/s]\r"
           "Capturing batches (bs=4 avail_mem=27.90 GB):  12%|#         | 1/8 [00:01<00:07,  1.00s/it]",
           "Traceback (most recent call last):",
           '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 2101, in '
           "init_device_graphs",
           "RuntimeError: Runtime check failed at /sgl-kernel/include/sgl_kernel/kvcache.cuh:196: CUDA error: "
           "invalid resource handle",
           "Exception: Capture cuda graph failed"]
    (f,) = run(log, dg.PlanFacts(target="sm_120a", given=True)).values()
    assert f.name == "cuda-graph-capture-failed"
    assert "in the decode graph at batch size 4" in f.cause and "invalid resource handle" in f.cause
    assert "sgl-project/sglang#18596" in f.fix and "this plan's target is sm_120" in f.fix


def test_verify_and_prefill_capture_failures_name_their_graph() -> None:
    verify = ["Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, bs=[1, 2, 3, 4, 5, 6, 7, 8]",
              "Capturing batches (bs=8 avail_mem=121.32 GB):   0%|  | 0/8\rCapturing batches (bs=6 avail_mem=121.3 GB)",
              "Exception: Capture cuda graph failed: operation not permitted when stream is capturing",
              "Possible solutions:"]
    f = run(verify)["cuda-graph-capture-failed"]
    assert "in the target verify graph at batch size 6: operation not permitted" in f.cause
    assert "18596" not in f.fix
    prefill = ["Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 8192], avail mem=133 GB",
               "Capturing num tokens (num_tokens=8192 avail_mem=133.80 GB):   0%|    | 0/3",
               "RuntimeError: CUDA error: operation failed due to a previous error during capture",
               "Fail when using backend: breakable for prefill runner."]
    f = run(prefill)["cuda-graph-capture-failed"]
    assert "in the target prefill graph at 8192 tokens: RuntimeError: CUDA error: operation failed" in f.cause


def test_capture_oom_and_illegal_access_keep_their_own_signature() -> None:
    begin = "Capture cuda graph begin. avail mem=10 GB"
    assert list(run([begin, "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB"])) \
        == ["capture-oom"]
    assert list(run([begin, f"Exception: Capture cuda graph failed: {IMA}"])) == ["illegal-memory-access-capture"]
    assert run(["a test named test_capture_cuda_graph_failed_handling passed"]) == {}
    width = ["Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, bs=[1, 2]",
             "Exception: Capture cuda graph failed: The size of tensor a (8) must match the size of tensor b (33) at "
             "non-singleton dimension 1"]
    assert list(run(width)) == ["graph-size-mismatch"]  # the specific kind, once
    plain = dg.PlanFacts(algorithm="none", given=True)
    assert list(run(width, plain)) == ["cuda-graph-capture-failed"]  # no draft/verify widths: the generic kind


# ------------------------------------------------------------------ kernel Xid lines


@pytest.mark.parametrize("line, name, action", [
    ("Dec 02 04:10:01 h200-01 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", "xid-node-reboot",
     "reboot the machine"),
    ("[ 5107.644336] NVRM: Xid (PCI:0000:03:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.",
     "xid-node-reboot", "will not bring it back"),
    ("NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP", "xid-gpu-reset",
     "nvidia-smi -r -i 0000:65:00"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     "xid-gpu-reset", "restarting the unit is not enough"),
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     "xid-node-reboot", "reboot"),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, name=python3, DBE (double bit error) ECC error", "xid-gpu-reset",
     "ROW_REMAPPER"),
    ("NVRM: Xid (PCI:0000:06:00): 31, pid=1234, name=python3, Ch 00000008, intr 10000000. MMU Fault", "xid-app-fault",
     "restart ddtree-sglang.service"),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "xid-other", "Xid 63 needs a GPU reset"),
    ("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff", "xid-other",
     "NVIDIA's Xid catalog"),
])
def test_each_xid_gets_its_documented_meaning_and_action(line: str, name: str, action: str) -> None:
    found = run([line], dg.PlanFacts(unit="ddtree-sglang.service", given=True))
    assert list(found) == [name], [f.message() for f in found.values()]
    f = found[name]
    assert action in f.fix and f.values["xid"] == int(line.split("): ")[1].split(",")[0])
    assert "NVIDIA Xid catalog" in f.source


@pytest.mark.parametrize("line, name, mnemonic", [
    # NVIDIA's catalog puts a context-switch timeout in RESET_GPU (not an application fault)
    ("NVRM: Xid (PCI:0000:41:00): 109, pid=3131, name=python3, Ch 00000010, errorString CTX SWITCH TIMEOUT",
     "xid-gpu-reset", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR"),
    # Xid 43 is the channel reset that follows the application's own error: IGNORE in the catalog
    ("NVRM: Xid (PCI:0000:41:00): 43, pid=3131, name=python3, Ch 00000010", "xid-other",
     "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR"),
    # PMU breakpoint: the catalog says contact support, no reset
    ("NVRM: Xid (PCI:0000:41:00): 61, 0cec(2f58) 00000000 00000000", "xid-other", "PMU_BREAKPOINT"),
    # NVLink5 (B300) link errors take the NVLink5 workflow: a GPU reset
    ("NVRM: Xid (PCI:0000:1b:00): 145, NVLink: RLW error on link 3", "xid-gpu-reset", "NVLINK_RLW_ERROR"),
    # a channel retirement is applied by a reboot of the machine (RESTART_BM)
    ("NVRM: Xid (PCI:0000:1b:00): 160, Channel retirement event", "xid-node-reboot", "CHANNEL_RETIREMENT_EVENT"),
    # RTX PRO 6000 Blackwell PMU halt (NVIDIA developer forum report, driver 595.58.03)
    ("NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342 20662ba6 20664272 2065f7ca 2063f48c",
     "xid-gpu-reset", "PMU_HALT_ERROR"),
])
def test_xid_buckets_follow_the_catalog_s_immediate_action(line: str, name: str, mnemonic: str) -> None:
    found = run([line], dg.PlanFacts(unit="ddtree-sglang.service", given=True))
    assert list(found) == [name], [f.message() for f in found.values()]
    f = found[name]
    assert mnemonic in f.values["meaning"] and "NVIDIA's immediate action" in f.values["meaning"]


def test_every_catalog_entry_names_its_mnemonic_action_and_source() -> None:
    buckets = {"RESTART_APP": "app", "RESET_GPU": "reset", "RESTART_BM": "reboot", "IGNORE": "other",
               "CONTACT_SUPPORT": "other", "WORKFLOW_XID_45": "other", "WORKFLOW_XID_48": "reset",
               "WORKFLOW_NVLINK_ERR": "reset", "WORKFLOW_NVLINK5_ERR": "reset"}
    for xid, e in dg.XID_CATALOG.items():
        assert e.mnemonic and e.mnemonic.upper() == e.mnemonic, xid
        assert buckets[e.immediate] == e.action, (xid, e.immediate, e.action)
        assert "NVIDIA" in e.source and ("docs.nvidia.com" in e.source or "NVSentinel" in e.source), xid


def test_a_reboot_is_never_advised_as_a_unit_restart() -> None:
    f = run(["NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."])["xid-node-reboot"]
    assert "fallen off the bus" in f.cause and "restart the unit" not in f.fix.lower()


def test_several_xids_each_name_their_kind() -> None:
    found = run(["NVRM: Xid (PCI:0000:2b:00): 45, pid=1, Ch 00000010",
                 "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."])
    assert list(found) == ["xid-node-reboot", "xid-other"]  # the reboot prints first


@pytest.mark.parametrize("line", [
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
    "nvidia-smi -q: Xid errors: none since boot",
    "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
])
def test_driver_lines_without_an_xid_are_no_finding(line: str) -> None:
    assert run([line]) == {}


# ------------------------------------------------------------------ nvidia_uvm and the health-probe crash


@pytest.mark.parametrize("line", [
    "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
    "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.",
    "failed to open /dev/nvidia-uvm: No such file or directory",
    "lstat /dev/nvidia-uvm: no such file or directory",
    "modprobe: FATAL: Module nvidia_uvm not found in directory /lib/modules/6.8.0-49-generic",
])
def test_missing_nvidia_uvm_symptoms(line: str) -> None:
    found = run([line])
    assert list(found) == ["nvidia-uvm-missing"]
    f = found["nvidia-uvm-missing"]
    assert "nvidia-modprobe -u -c=0" in f.fix
    assert ("most likely missing" in f.cause) == ("unknown error" in line)  # a symptom, not proof


def test_other_device_nodes_stay_their_own_kind() -> None:
    assert list(run(["open /dev/nvidia3: No such file or directory"])) == ["device-nodes-missing"]
    assert run(["ok   device_nodes: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia0 present"]) == {}


def test_abandoned_health_probes_batching_crash() -> None:
    crash = "ValueError: q.shape[0] (1) does not match qo_indptr[-1] (5)"
    alone = run([crash])["batch-qo-indptr-mismatch"]
    assert "q.shape[0] 1 vs qo_indptr[-1] 5" in alone.cause and "no /health failure" in alone.cause
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false" in alone.fix and "#35896" in alone.fix
    after = run(["[2026-08-21 10:00:00] Health check failed. Server couldn't get a response from detokenizer for "
                 "last 20 seconds. tic start time: 10:00:00. last_heartbeat time: 09:59:40", crash])
    assert "timed out earlier in this log" in after["batch-qo-indptr-mismatch"].cause
    assert run(["ValueError: q.shape[0] (5) does not match kv_indptr[-1] (5)"]) == {}


# ------------------------------------------------------------------ --unit reads the kernel journal too


def stand_in(tmp_path: Path, unit_log: Path, kernel: str, kernel_rc: int = 0) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "kernel.txt").write_text(kernel)
    script = bindir / "journalctl"
    script.write_text(f'#!/bin/sh\nif [ "$1" = -k ]; then printf "%s\\n" "$@" > {tmp_path / "kargv"}; '
                      f'cat {tmp_path / "kernel.txt"}; exit {kernel_rc}; fi\ncat {unit_log}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_unit_findings_include_the_boots_kernel_journal(capsys, tmp_path: Path, monkeypatch) -> None:
    healthy = GPU / "sglang-0.5.17-h200-2026-12-01/none/server-NONE-30001.log"
    bindir = stand_in(tmp_path, healthy, "NVRM: loading NVIDIA UNIX Open Kernel Module\n"
                      "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, out, _ = cli(capsys, ["--unit", "ddtree-sglang.service", "--lines", "400"])
    assert rc == 1 and out.count("\n") == 1
    assert out.startswith("FAIL xid-node-reboot (kernel line 2): the NVIDIA driver logged Xid 79 on GPU 0000:2b:00")
    assert (tmp_path / "kargv").read_text().split() == ["-k", "-b", "--no-pager", "-o", "cat", "-n", "400"]
    rc, out, _ = cli(capsys, ["--unit", "ddtree-sglang.service", "--json"])
    doc = json.loads(out)
    assert [(f["name"], f["origin"], f["line"]) for f in doc["findings"]] == [("xid-node-reboot", "kernel", 2)]
    assert doc["source"] == "journalctl -u ddtree-sglang.service + journalctl -k -b (2 lines)"


def test_an_unreadable_kernel_journal_is_a_note_not_a_failure(capsys, tmp_path: Path, monkeypatch) -> None:
    healthy = GPU / "sglang-0.5.17-h200-2026-12-01/none/server-NONE-30001.log"
    bindir = stand_in(tmp_path, healthy, "", kernel_rc=1)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, out, _ = cli(capsys, ["--unit", "ddtree-sglang.service"])
    assert rc == 0 and out.startswith("ok   no known failure signature in ")
    assert "kernel journal not read (journalctl -k failed (exit 1)" in out


def test_a_file_is_never_joined_by_the_kernel_journal(capsys, tmp_path: Path, monkeypatch) -> None:
    bindir = stand_in(tmp_path, Path("/dev/null"), "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "app.log"
    log.write_text("all good\n")
    assert cli(capsys, ["--file", str(log)])[0] == 0 and not (tmp_path / "kargv").exists()


# ------------------------------------------------------------------ a path argument, holes, bidi controls


def test_a_path_argument_reads_the_file_like_grep(capsys, tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n")
    rc, out, err = cli(capsys, [str(log)])
    assert rc == 1 and out.startswith("FAIL xid-node-reboot (line 1)") and err == ""
    assert cli(capsys, [str(log), "--json"])[0] == 1
    rc, _, err = cli(capsys, [str(tmp_path)])
    assert rc == 2 and "a directory, not a file" in err


def test_a_final_line_after_a_nul_hole_is_read(capsys, tmp_path: Path) -> None:
    """A log truncated under its writer (copytruncate) has a hole of NULs before the writer's next line."""
    tail = f"{IMA}\n"
    log = tmp_path / "hole.log"
    with open(log, "wb") as fh:
        fh.write(b"[2026-12-02 01:00:00] Decode batch, #running-req: 1\n")
        fh.truncate(3 << 20)  # a 3 MiB hole (reads as NUL bytes)
        fh.seek(3 << 20)
        fh.write(tail.encode())
    rc, out, _ = cli(capsys, ["--file", str(log), "--max-mib", "1", "--json"])  # the read starts inside the hole
    doc = json.loads(out)
    assert doc["lines"] == 1 and [f["name"] for f in doc["findings"]] == ["illegal-memory-access"]
    assert doc["findings"][0]["quote"] == IMA
    rc, out, _ = cli(capsys, ["--file", str(log), "--json"])  # the whole file: the hole sits inside a line
    doc = json.loads(out)
    assert doc["lines"] == 2 and doc["findings"][0]["line"] == 2 and doc["findings"][0]["quote"] == IMA


def test_a_hole_without_a_newline_after_it_still_counts(tmp_path: Path) -> None:
    log = tmp_path / "hole2.log"
    log.write_bytes(b"\0" * (2 << 20) + IMA.encode())
    lines = dg.split_lines(dg.read_file(log, 1 << 20))
    assert lines == [IMA]


BIDI = ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200f", "\u200b", "\u2028", "\ufeff", "\u061c"]


@pytest.mark.parametrize("ch", BIDI, ids=lambda c: f"U+{ord(c):04X}")
def test_format_controls_never_reach_an_echo(capsys, tmp_path: Path, ch: str) -> None:
    log = tmp_path / "q.log"
    log.write_text(f"{IMA} {ch}gnp.exe\n")
    rc, out, err = cli(capsys, ["--file", str(log)])
    assert rc == 1 and ch not in out + err
    rc, out, err = cli(capsys, ["--file", str(log), "--json"])
    assert ch not in out and ch not in json.loads(out)["findings"][0]["quote"]
    rc, out, err = cli(capsys, ["--file", str(log), "--plan", str(tmp_path / f"p{ch}lan.json")])
    assert rc == 2 and ch not in err and "--plan" in err
    rc, out, err = cli(capsys, [str(tmp_path / f"no{ch}file.log")])
    assert rc == 2 and ch not in err
    assert ch not in dg._clean(f"a{ch}b")


def test_a_journalctl_error_echo_is_cleaned(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "journalctl"
    script.write_text("#!/bin/sh\nprintf 'Failed: \\342\\200\\256 evil\\n' >&2\nexit 1\n")  # U+202E in UTF-8
    script.chmod(0o755)
    with pytest.raises(dg.DiagnoseError) as exc:
        dg.read_journal("ddtree-sglang.service", journalctl=str(script))
    assert "\u202e" not in str(exc.value) and "Failed:" in str(exc.value)
    kernel, note = dg.read_kernel_lines(journalctl=str(script))
    assert kernel is None and "\u202e" not in note and "Failed:" in note


@pytest.mark.parametrize("hostile", ['File "/' * 600, "/a" * 2048, "/" + "a" * 4095, 'File "/' + "x" * 4000,
                                     "/opt/ddtree-ops" * 270, "server_args=" + "speculative_algorithm=" * 180])
def test_evidence_is_linear_on_hostile_lines(hostile: str) -> None:
    import time

    t0 = time.perf_counter()
    for _ in range(20):
        dg.evidence(hostile[: dg.MAX_LINE])
    assert time.perf_counter() - t0 < 1.0
