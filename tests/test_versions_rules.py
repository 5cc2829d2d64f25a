"""Version-aware rules of the build table: attention backends per
release and arch, the build's CUDA driver floor, SGLang env names, ``extra_args``.

The table's facts are checked against the real packages in ``tests/peer/test_versions_table.py``.
"""

from __future__ import annotations

import pytest

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.build_table import (
    ARCH_RULES,
    BACKEND_CHOICES,
    BUILD_REQUIRES_CUDA,
    SECRET_FLAGS,
    arch_rules,
    cuda_major_of_requires,
    env_problem,
    owned_flag,
    secret_flag,
)
from ddtree_ops.config.toolchain import CUDA_TOOLKITS
from ddtree_ops.render.argv import build_argv


def ct200(version: str = "0.5.23", **server) -> dict:
    """A plain (no speculation) RTX PRO 6000 deployment of SGLang ``version`` from PyPI."""
    return {
        "ddtree_host_class": "ct200",
        "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "Qwen/Qwen3-8B"},
        "ddtree_speculative": {"algorithm": "none"},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 16, **server},
    }


def findings(hv: dict) -> tuple[list, list]:
    """``(errors, warnings)``."""
    try:
        v = validate_hostvars("h1", hv)
    except ConfigError as exc:
        return [f for f in exc.findings if f.level == "error"], [f for f in exc.findings if f.level == "warning"]
    return [], v.warnings


def errors_at(hv: dict, prefix: str) -> list:
    return [f for f in findings(hv)[0] if f.field.startswith(prefix)]


# --- attention backends per version and arch ---------------------------------

def test_ct200_0523_trtllm_mha_ok():
    errors, _ = findings(ct200("0.5.23", attention_backend="trtllm_mha"))
    assert errors == []


def test_ct200_0523_trtllm_mha_with_fp8_kv_refused():
    hv = ct200("0.5.23", attention_backend="trtllm_mha", extra_args={"--kv-cache-dtype": "fp8_e4m3"})
    [f] = errors_at(hv, "ddtree_server.attention_backend")
    assert f.value == "trtllm_mha" and "fp8_e4m3" in f.rule and "sm_120" in f.rule
    assert "trtllm-mha-sm120-fp8-kv" in f.rule and "attention_hook.py" in f.source
    # the same build with a bf16 KV cache is fine
    assert errors_at(ct200("0.5.23", attention_backend="trtllm_mha", extra_args={"--kv-cache-dtype": "bf16"}),
                     "ddtree_server") == []


def test_ct200_0523_trtllm_mha_with_skip_softmax_refused():
    hv = ct200("0.5.23", attention_backend="trtllm_mha")
    hv["ddtree_service"] = {"env": {"SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR": "0.5"}}
    [f] = errors_at(hv, "ddtree_server.attention_backend")
    assert "skip-softmax" in f.rule
    hv["ddtree_service"]["env"]["SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR"] = "0"
    assert errors_at(hv, "ddtree_server.attention_backend") == []


def test_ct200_05131_trtllm_mha_refused():
    [f] = errors_at(ct200("0.5.13.post1", attention_backend="trtllm_mha"), "ddtree_server.attention_backend")
    assert "0.5.13.post1" in f.rule and "prefill" in f.rule and "SM100" in f.rule
    assert f.source.startswith("sglang/srt/server_args.py")


def test_05131_trtllm_mha_decode_only_is_ok_on_ct200():
    """0.5.13.post1 refuses trtllm_mha for prefill only; decode runs on SM120."""
    hv = ct200("0.5.13.post1", attention_backend="flashinfer", extra_args={"--decode-attention-backend": "trtllm_mha"})
    assert findings(hv)[0] == []
    hv = ct200("0.5.13.post1", attention_backend="flashinfer", extra_args={"--prefill-attention-backend": "trtllm_mha"})
    [f] = findings(hv)[0]
    assert f.field == "ddtree_server.extra_args.--prefill-attention-backend"


def test_b300_05131_trtllm_mha_ok():
    hv = ct200("0.5.13.post1", attention_backend="trtllm_mha")
    hv["ddtree_host_class"] = "b300"
    assert findings(hv)[0] == []


def test_unknown_backend_refused_naming_choices():
    [f] = findings(ct200("0.5.23", attention_backend="foo_bar"))[0]
    assert f.field == "ddtree_server.attention_backend" and f.value == "foo_bar"
    assert "0.5.23" in f.rule and all(n in f.fix for n in BACKEND_CHOICES["0.5.23"].attention)
    [f] = findings(ct200("0.5.23", attention_backend="flashinfr"))[0]
    assert "did you mean flashinfer" in f.rule


def test_backend_names_follow_the_version():
    """``hpc_ops`` is new in 0.5.23; ``cutlass_mla`` is gone there."""
    hv = ct200("0.5.13.post1", attention_backend="hpc_ops")
    hv["ddtree_host_class"] = "b300"
    assert [f.field for f in findings(hv)[0]] == ["ddtree_server.attention_backend"]
    hv["ddtree_sglang"]["version"] = "0.5.23"
    assert findings(hv)[0] == []
    hv["ddtree_server"]["attention_backend"] = "cutlass_mla"
    assert [f.value for f in findings(hv)[0]] == ["cutlass_mla"]


def test_draft_backend_checked_against_draft_choices():
    hv = ct200("0.5.23", attention_backend="triton")
    hv["ddtree_host_class"] = "b300"
    hv["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z-lab/Qwen3-8B-DFlash-b16",
                                "block_size": 16, "draft_attention_backend": "flashmla"}
    [f] = findings(hv)[0]
    assert f.field == "ddtree_speculative.draft_attention_backend" and "draft attention backend" in f.rule
    assert "trtllm_mha" in f.fix and "flashmla" not in f.fix


def test_fa3_refused_on_blackwell_every_version():
    for version in ("0.5.13.post1", "0.5.23"):
        hv = ct200(version, attention_backend="fa3")
        [f] = findings(hv)[0]
        assert "fa3-needs-sm80-sm90" in f.rule
        hv["ddtree_host_class"] = "b300"
        [f] = findings(hv)[0]
        assert "sm_103" in f.rule


def test_fa4_sm120_by_version():
    [f] = findings(ct200("0.5.13.post1", attention_backend="fa4"))[0]
    assert "fa4-no-sm120-kernels" in f.rule
    assert findings(ct200("0.5.23", attention_backend="fa4"))[0] == []


def test_trtllm_mla_allowed_on_sm120():
    """SGLang allows trtllm_mla on SM100/SM12x (both peer releases); the old blanket rule did not."""
    for version in ("0.5.13.post1", "0.5.23"):
        assert findings(ct200(version, attention_backend="trtllm_mla"))[0] == []


def test_unread_version_warns_instead_of_guessing():
    errors, warnings = findings(ct200("0.5.19", attention_backend="foo_bar"))
    assert errors == []
    assert any("never read off its package" in w.rule for w in warnings)


def h200(version: str = "0.5.17", **server) -> dict:
    """A plain deployment on the lent 1x H200 (built-in class h200x1, sm_90)."""
    return {**ct200(version, **server), "ddtree_host_class": "h200x1",
            "ddtree_server": {"tp_size": 1, "max_running_requests": 16, **server}}


def test_0517_rows_were_read_off_its_wheel():
    """0.5.17 (no peer version) has rows read off the released wheel: its parser's backend names,
    its draft worker's names, a cu13 build, the split CUDA-graph dialect; and the sm_90 rule of the
    table (trtllm_mha prefill is SM100-only before 0.5.23) applies to an H200."""
    assert "hpc_ops" in BACKEND_CHOICES["0.5.17"].attention and "qsa" not in BACKEND_CHOICES["0.5.17"].attention
    assert BUILD_REQUIRES_CUDA["0.5.17"].cuda_major == 13
    [f] = errors_at(h200(attention_backend="foo_bar"), "ddtree_server.attention_backend")
    assert "SGLang 0.5.17 has no attention backend 'foo_bar'" in f.rule
    assert findings(h200(attention_backend="triton")) == ([], [])
    [f] = errors_at(h200(attention_backend="trtllm_mha"), "ddtree_server.attention_backend")
    assert "trtllm-mha-prefill-sm100-only" in f.rule and "sm_90 (h200x1)" in f.rule
    v = validate_hostvars("h1", h200(attention_backend="triton", cuda_graph_max_bs=16))
    assert "--cuda-graph-max-bs-decode" in build_argv(v.deployment, v.plan)
    assert v.plan.toolchain["min_driver"] == "580.65.06"  # a cu13 build on CUDA 13.0 (sm_90's default)


def test_arch_rules_ranges():
    assert [r.rule for r in arch_rules("0.5.13.post1", "sm_120", "trtllm_mha", "prefill")] == [
        "trtllm-mha-prefill-sm100-only"]
    assert arch_rules("0.5.13.post1", "sm_120", "trtllm_mha", "decode") == []
    assert {r.rule for r in arch_rules("0.5.23", "sm_120", "trtllm_mha", "prefill")} == {
        "trtllm-mha-sm120-fp8-kv", "trtllm-mha-sm120-skip-softmax"}
    assert [r.rule for r in arch_rules("0.5.24", "sm_120", "trtllm_mha", "prefill") if r.when is None] == []
    for r in ARCH_RULES:
        assert r.source and "SGLang 0.5." in r.source and r.evidence[0].startswith("sglang/")


# --- driver floor of the build ------------------------------------------------

def test_cuda_major_from_requires_dist():
    major, why = cuda_major_of_requires([
        "cuda-python>=13.0", "flashinfer_python[cu13]==0.7.2", "nvshmem4py-cu13", "torch==2.11.0",
        'decord2; sys_platform == "linux" and platform_machine == "aarch64"',
        'cupy-cuda14x-cu14; sys_platform == "darwin"',
    ])
    assert major == 13 and why == ["cuda-python>=13.0", "flashinfer_python[cu13]==0.7.2", "nvshmem4py-cu13"]
    assert cuda_major_of_requires(["torch==2.9", "numpy"]) == (None, [])
    assert cuda_major_of_requires(["flashinfer-python[cu12]", "sgl-kernel-cu12"])[0] == 12


def test_table_rows_derive_their_own_major():
    for row in BUILD_REQUIRES_CUDA.values():
        assert cuda_major_of_requires(row.requires) == (row.cuda_major, list(row.requires))


def test_plan_driver_floor_is_the_build_s_when_toolkit_is_12_8():
    hv = ct200("0.5.23", attention_backend="triton")
    hv["ddtree_toolchain"] = {"cuda": "12.8"}
    tc = validate_hostvars("h1", hv).plan.toolchain
    assert tc["cuda"] == "12.8"
    assert tc["min_driver"] == CUDA_TOOLKITS["13.0"].min_driver == "580.65.06"
    assert tc["toolkit_min_driver"] == "570.26" and "cu13" in tc["min_driver_reason"]
    [w] = [w for w in validate_hostvars("h1", hv).warnings if w.field == "ddtree_toolchain.cuda"]
    assert "580.65.06" in w.rule and "570.26" in w.rule and "flashinfer_python[cu13]" in w.rule
    hv["ddtree_toolchain"] = {"cuda": "13.0"}
    assert not [w for w in validate_hostvars("h1", hv).warnings if w.field == "ddtree_toolchain.cuda"]


def test_driver_check_uses_the_plan_floor():
    """Toolkit 12.8 alone accepts driver 575; the cu13 SGLang build does not."""
    from ddtree_ops.host.toolkit import DriverCheckError, check_driver

    hv = ct200("0.5.23", attention_backend="triton")
    hv["ddtree_toolchain"] = {"cuda": "12.8"}
    tc = validate_hostvars("h1", hv).plan.toolchain
    assert check_driver("575.57.08, 12.0\n", 0, "12.8", "sm_120")  # the toolkit alone
    with pytest.raises(DriverCheckError) as exc:
        check_driver("575.57.08, 12.0\n", 0, "12.8", "sm_120", "", tc["min_driver"], tc["min_driver_reason"])
    msg = str(exc.value)
    assert "needs >= 580.65.06" in msg and "flashinfer_python[cu13]" in msg and "older CUDA" in msg
    assert check_driver("580.65.06, 12.0\n", 0, "12.8", "sm_120", "", tc["min_driver"], tc["min_driver_reason"])
    # a lower build floor never lowers the toolkit's
    with pytest.raises(DriverCheckError, match="needs >= 580.65.06, NVIDIA CUDA release notes"):
        check_driver("575.57.08, 10.3\n", 0, "13.0", "sm_103", "", "525.60.13", "cu12 wheels")
    with pytest.raises(DriverCheckError, match="not a dotted driver version"):
        check_driver("580.65.06, 10.3\n", 0, "13.0", "sm_103", "", "580; rm -rf /")


def test_simulator_without_release_has_no_build_floor():
    hv = ct200("0.5.23", attention_backend="triton")
    hv["ddtree_sglang"] = {"source": "simulator", "version": "0.5.23"}
    hv["ddtree_toolchain"] = {"cuda": "12.8"}
    tc = validate_hostvars("h1", hv).plan.toolchain
    assert tc["min_driver"] == tc["toolkit_min_driver"] == "570.26"


# --- environment names --------------------------------------------------------

def test_env_unknown_name_warns_with_the_closest():
    rule, fix = env_problem("0.5.23", "SGLANG_PLUGIN")
    assert "reads no variable SGLANG_PLUGIN" in rule and "SGLANG_PLUGINS" in fix


def test_env_renamed_names_the_current_one():
    rule, fix = env_problem("0.5.13.post1", "SGLANG_NSA_FUSE_TOPK")
    assert "renamed" in rule and fix == "rename it to SGLANG_DSA_FUSE_TOPK"
    rule, fix = env_problem("0.5.23", "SGL_ENABLE_JIT_DEEPGEMM")
    assert fix == "rename it to SGLANG_ENABLE_JIT_DEEPGEMM"
    assert env_problem("0.5.23", "SGLANG_PLUGINS") is None
    assert env_problem("0.5.23", "TRITON_PTXAS_PATH") is None  # not SGLang's
    assert env_problem("0.5.17", "SGLANG_WHATEVER") is None  # never read: not guessed


def test_env_deprecated_for_a_flag_names_the_flag():
    rule, fix = env_problem("0.5.23", "SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE")
    assert "deprecated" in rule and "--enable-prefill-delayer" in fix
    rule, fix = env_problem("0.5.13.post1", "SGLANG_PER_TOKEN_GROUP_QUANT_8BIT_V2")
    assert fix == "remove it"


def test_env_of_an_unread_release_warns_once_unchecked():
    hv = ct200("0.5.17", attention_backend="triton")
    hv["ddtree_service"] = {"env": {"SGLANG_WHATEVER": "1", "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas"}}
    [w] = [w for w in findings(hv)[1] if w.field.startswith("ddtree_service.env")]
    assert w.value == ["SGLANG_WHATEVER"] and "never read" in w.rule


def test_env_rule_warns_in_validation():
    hv = ct200("0.5.23", attention_backend="triton")
    hv["ddtree_service"] = {"env": {"SGLANG_QUEUED_TIMEOUT_MS": "1000", "SGLANG_ENABLE_TORCH_COMPILE": "1"}}
    errors, warnings = findings(hv)
    assert errors == []
    [w] = [w for w in warnings if w.field.startswith("ddtree_service.env")]
    assert w.field == "ddtree_service.env.SGLANG_QUEUED_TIMEOUT_MS" and "1000" not in w.message()


# --- extra_args -----------------------------------------------------------------

def test_extra_args_rendered_after_the_owned_flags():
    hv = ct200("0.5.23", attention_backend="triton",
               extra_args={"--disaggregation-bootstrap-port": 30011, "--disable-custom-all-reduce": True,
                           "--mm-attention-backend": "fa4", "--allowed-media-domains": ["a.example", "b.example"]})
    v = validate_hostvars("h1", hv)
    argv = build_argv(v.deployment, v.plan)
    tail = argv[argv.index("--disaggregation-bootstrap-port"):]
    assert tail == ["--disaggregation-bootstrap-port", "30011", "--disable-custom-all-reduce",
                    "--mm-attention-backend", "fa4", "--allowed-media-domains", "a.example", "b.example"]


@pytest.mark.parametrize("flag", ["--port", "--host", "--cuda-graph-max-bs-decode", "--cuda-graph-bs",
                                  "--speculative-num-draft-tokens", "--speculative-algorithm", "--tp-size",
                                  "--tensor-parallel-size", "--model", "--disable-cuda-graph", "--cuda-graph-max",
                                  "--attention-backend", "--page-size", "--mem-frac", "--config",
                                  "--nccl-port", "--base-gpu-id", "--revision"])
def test_extra_args_owned_flag_refused(flag):
    [f] = errors_at(ct200("0.5.23", attention_backend="triton", extra_args={flag: "8"}), "ddtree_server.extra_args")
    assert f.field == f"ddtree_server.extra_args.{flag}" and "set by ddtree-ops" in f.rule
    assert owned_flag(flag) is not None


def test_extra_args_full_tree_keeps_triton_per_phase():
    """Full-tree DDTree needs triton; a per-phase backend in extra_args must not undo it."""
    from helpers import base_hostvars

    hv = base_hostvars()
    hv["ddtree_server"]["extra_args"] = {"--decode-attention-backend": "flashinfer"}
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert f.field == "ddtree_server.extra_args.--decode-attention-backend" and "tree mask" in f.rule
    hv["ddtree_server"]["extra_args"] = {"--decode-attention-backend": "triton"}
    assert errors_at(hv, "ddtree_server") == []


def test_extra_args_on_a_simulator_host_parse_with_the_simulator():
    hv = ct200("0.5.23", attention_backend="triton", extra_args={"--disable-custom-all-reduce": True})
    hv["ddtree_sglang"] = {"source": "simulator", "version": "0.5.23"}
    assert errors_at(hv, "ddtree_server.extra_args") == []
    hv["ddtree_server"]["extra_args"] = {"--disaggregation-bootstrap-port": 30011, "--disable-custom-all-reduce": True}
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert ("simulator" in f.rule and "--disaggregation-bootstrap-port" in f.rule
            and "--disable-custom-all-reduce" not in f.rule)
    hv["ddtree_server"]["extra_args"] = {"--decode-log-interval": "many"}
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "invalid int value" in f.rule


def test_extra_args_ports_checked_against_the_host_s():
    hv = ct200("0.5.23", attention_backend="triton", extra_args={"--disaggregation-bootstrap-port": 30000})
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "clashes with ddtree_server.port" in f.rule
    hv["ddtree_server"]["extra_args"] = {"--disaggregation-bootstrap-port": 80}
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "1024-65535" in f.rule
    hv["ddtree_server"]["extra_args"] = {"--disaggregation-bootstrap-port": 30100}  # the rendezvous port (port + 100)
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "nccl" in f.rule.lower() or "rendezvous" in f.rule
    hv["ddtree_server"]["extra_args"] = {"--disaggregation-bootstrap-port": 30011}
    assert errors_at(hv, "ddtree_server.extra_args") == []


def test_extra_args_unowned_flags_allowed():
    for flag in ("--disaggregation-bootstrap-port", "--dist-init-addr", "--enable-expert-distribution-metrics",
                 "--kv-cache-dtype"):
        assert owned_flag(flag) is None


def test_extra_args_secret_flag_refused_and_not_echoed():
    hv = ct200("0.5.23", attention_backend="triton", extra_args={"--api-key": "sk-CANARY123"})
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "secret" in f.rule and "CANARY" not in f.message()


@pytest.mark.parametrize("extra, needle", [
    ({"--disaggregation-bootstrap-port": "-1"}, "starts with -"),
    ({"--disaggregation-bootstrap-port": -1}, "starts with -"),
    ({"--chat-template": "--port=1"}, "starts with -"),
    ({"--chat-template": "a\nExecStartPre=/bin/sh"}, "'\\n'"),
    ({"--chat-template": "a b"}, "' '"),
    ({"--x": ["ok", "-bad"]}, "starts with -"),
    ({"-p": 1}, "long option"),
    ({"--Port": 1}, "long option"),
    ({"--port=1": 1}, "long option"),
    ({"--nccl-port": False}, "sets nothing"),
    ({"--nccl-port": None}, "sets nothing"),
    ({"--nccl-port": []}, "sets nothing"),
    ({"--nccl-port": {"a": 1}}, "string or a number"),
    ({"--nccl-port": [True]}, "string or a number"),
    ({"--nccl-port": "x" * 5000}, "4096"),
    ({"--x": list(range(65))}, "at most 64"),
    ({f"--f{i}": 1 for i in range(65)}, "64"),
])
def test_extra_args_values_validated_like_argv(extra, needle):
    hv = ct200("0.5.23", attention_backend="triton", extra_args=extra)
    errors = errors_at(hv, "ddtree_server.extra_args")
    assert errors, extra
    text = " ".join(f.message() for f in errors)
    assert needle in text, text
    assert "\n" not in text  # one line per finding; the value is shown escaped


# --- driver floor at deploy time: the actual wheel's Requires-Dist ----------------------------

def _wheel(tmp_path, metadata: str, name: str = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
           dist_info: str = "sglang-0.5.23.dist-info", extra: dict | None = None):
    import zipfile

    p = tmp_path / name
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
        zf.writestr(f"{dist_info}/METADATA", metadata)
        for k, v in (extra or {}).items():
            zf.writestr(k, v)
    return p


@pytest.mark.parametrize("version", sorted(BUILD_REQUIRES_CUDA))
def test_table_equals_the_released_metadata(version):
    """The plan-time table row equals what the released wheel's METADATA (fixture) asks for."""
    from helpers import FIXTURES

    from ddtree_ops.host.toolkit import wheel_requires

    name, requires = wheel_requires(_meta_dir(FIXTURES / "sglang" / f"METADATA-{version}"))
    assert name == f"sglang {version}"
    row = BUILD_REQUIRES_CUDA[version]
    assert cuda_major_of_requires(requires) == (row.cuda_major, list(row.requires))


def _meta_dir(metadata_file):
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp()) / "sglang.dist-info"
    d.mkdir()
    (d / "METADATA").write_bytes(metadata_file.read_bytes())
    return d


def test_wheel_driver_check_reads_the_actual_wheel(tmp_path):
    from helpers import FIXTURES

    from ddtree_ops.host.toolkit import DriverCheckError, check_build_driver

    wheel = _wheel(tmp_path, (FIXTURES / "sglang" / "METADATA-0.5.23").read_text())
    with pytest.raises(DriverCheckError) as exc:
        check_build_driver("575.57.08", wheel)
    msg = str(exc.value)
    assert "sglang 0.5.23" in msg and "flashinfer_python[cu13]==0.7.2" in msg and ">= 580.65.06" in msg
    assert "\n" not in msg and "Fix:" in msg
    assert "driver 580.65.06 ok" in check_build_driver("580.65.06", wheel)


def test_wheel_driver_check_without_cuda_deps(tmp_path):
    from ddtree_ops.host.toolkit import check_build_driver

    wheel = _wheel(tmp_path, "Metadata-Version: 2.1\nName: sglang\nVersion: 9.9\nRequires-Dist: numpy\n\nREADME\n")
    assert "not constrained" in check_build_driver("535.104.05", wheel)


@pytest.mark.parametrize("make, needle", [
    (lambda t: t / "missing.whl", "cannot read"),
    (lambda t: (t / "junk.whl").write_bytes(b"not a zip") and t / "junk.whl", "cannot read"),
    (lambda t: _wheel(t, "Name: sglang\n", extra={"other-1.0.dist-info/METADATA": "Name: other\n"}), "has 2"),
    (lambda t: _wheel(t, "Name: sglang\n", dist_info="deep/sglang-0.5.23.dist-info"), "has 0"),
])
def test_wheel_driver_check_refuses_unreadable_wheels(tmp_path, make, needle):
    from ddtree_ops.host.toolkit import DriverCheckError, check_build_driver

    with pytest.raises(DriverCheckError, match=needle):
        check_build_driver("580.65.06", make(tmp_path))


def test_wheel_driver_check_refuses_a_bad_driver_string(tmp_path):
    from ddtree_ops.host.toolkit import DriverCheckError, check_build_driver

    with pytest.raises(DriverCheckError, match="not dotted numbers"):
        check_build_driver("580;reboot", _wheel(tmp_path, "Name: sglang\n"))


def _toolkit_action(**args):
    """Run the ``ddtree_toolkit`` action plugin as Ansible does, on the controller."""
    import sys
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.template import Templar
    from helpers import REPO

    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_toolkit import ActionModule
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = args
    loader = DataLoader()
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # never used: runs on the controller
    action = ActionModule(task=task, connection=connection, play_context=None, loader=loader,
                          templar=Templar(loader=loader, variables={}), shared_loader_obj=None)
    return action.run(task_vars={})


def test_toolkit_action_driver_check_takes_the_plan_floor():
    base = {"check": "driver", "stdout": "575.57.08, 12.0\n", "rc": 0, "stderr": "", "cuda": "12.8", "arch": "sm_120"}
    assert not _toolkit_action(**base).get("failed")
    r = _toolkit_action(**base, min_driver="580.65.06", min_driver_reason="the SGLang build depends on CUDA 13 wheels")
    assert r["failed"] and "needs >= 580.65.06, the SGLang build depends on CUDA 13 wheels" in r["msg"]
    r = _toolkit_action(**{**base, "stdout": "580.95.05, 12.0\n"}, min_driver="580.65.06")
    assert not r.get("failed") and "the SGLang build (>= 580.65.06)" in r["msg"]


def test_toolkit_action_build_driver_reads_the_wheelhouse(tmp_path):
    from helpers import FIXTURES

    _wheel(tmp_path, (FIXTURES / "sglang" / "METADATA-0.5.23").read_text())
    (tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl").write_bytes(b"")  # other wheels are not read
    r = _toolkit_action(check="build_driver", wheelhouse=str(tmp_path), driver_version="575.57.08")
    assert r["failed"] and "sglang 0.5.23" in r["msg"] and ">= 580.65.06" in r["msg"]
    r = _toolkit_action(check="build_driver", wheelhouse=str(tmp_path), driver_version="580.95.05")
    assert not r.get("failed") and r["wheel"].startswith("sglang-0.5.23-")
    r = _toolkit_action(check="build_driver", wheelhouse=str(tmp_path / "none"), driver_version="580.95.05")
    assert r["failed"] and "found 0" in r["msg"]


@pytest.mark.parametrize("flag", ["--api-ke", "--admin-api-k", "--admin", "--ssl-keyfile-pass", "--api-key"])
def test_extra_args_abbreviated_secret_flag_refused_and_not_echoed(flag):
    """SGLang's parser accepts unique prefixes (``allow_abbrev``): ``--api-ke X`` sets api_key."""
    hv = ct200("0.5.23", attention_backend="triton", extra_args={flag: "SEKRITabbrev"})
    [f] = errors_at(hv, "ddtree_server.extra_args")
    assert "secret" in f.rule and "SEKRIT" not in f.message()
    assert secret_flag(flag) in SECRET_FLAGS


def test_exact_option_that_prefixes_a_secret_flag_allowed():
    assert secret_flag("--ssl-keyfile") is None and secret_flag("--kv-cache-dtype") is None
    assert errors_at(ct200("0.5.23", attention_backend="triton", extra_args={"--ssl-keyfile": "/etc/k.pem"}),
                     "ddtree_server.extra_args") == []


@pytest.mark.parametrize("extra", [{"--tokenizer-path": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"},
                                   {"--lora-paths": ["a=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"]}])
def test_extra_args_value_holding_a_token_is_refused_and_not_echoed(extra):
    """A raw Hugging Face token as a flag value went into the 0644 unit and plan.json."""
    from ddtree_ops.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", ct200("0.5.23", attention_backend="triton", extra_args=extra))
    text = "\n".join(f.message() for f in exc.value.findings)
    assert "Hugging Face token" in text and "hf_AbCd" not in text


def test_the_docs_and_shipped_comments_say_what_the_arch_rules_do():
    """docs/configuration.md and the ct200 inventories said trtllm_mha / trtllm_mla / fa4 are refused on
    sm_120 after the rules became version-aware: every rule of the table is named in the docs with its
    backend and first version, and no shipped comment says a backend 0.5.23 accepts there has no kernels."""
    import re
    from pathlib import Path

    from ddtree_ops.config.build_table import ARCH_RULES, arch_rules

    repo = Path(__file__).resolve().parents[1]
    docs = (repo / "docs" / "configuration.md").read_text()
    for rule in ARCH_RULES:
        assert f"`{rule.rule}`" in docs and f"`{rule.backend}`" in docs, rule.rule
    for backend in ("trtllm_mla", "fa4"):  # accepted on sm_120 by 0.5.23 in every phase
        assert not any(arch_rules("0.5.23", "sm_120", backend, ph) for ph in ("prefill", "decode", "draft"))
    assert not arch_rules("0.5.23", "sm_120", "trtllm_mha", "decode")
    for inv in ("example", "multi-example", "dflash-example"):
        text = (repo / "inventory" / inv / "group_vars" / "ct200.yml").read_text()
        assert not re.search(r"no trtllm|trtllm_\* ?/|fa4 (attention )?kernels", text), inv
