"""CrashReport from exit statuses and llama-server logs (samples as b11434 prints them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from triage.drills.standin import AMX_CRASH_LOG
from triage.llama.crash import (
    AMX_WORKAROUND_NOTE,
    backtrace_frames,
    crash_report,
    crash_symbol,
    host_cpu_flags,
    host_has_amx,
    parse_cpu_flags,
    read_log,
    signal_name,
    system_info_features,
)

# The start of a real b11434 log at -lv 4 on this (AMD, no AMX) host: REPACK on, no AMX.
NO_AMX_LOG = """\
0.00.009.019 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the \
`-lv N` CLI arg)
0.00.009.029 I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)
0.00.009.085 I cmn  common_param: system_info: n_threads = 1 (n_threads_batch = 1) / 2 | \
CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | \
AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | 
0.00.011.669 I srv    load_model: loading model '/tmp/drill/gemma4-thinking-budget-qat.gguf'
0.00.020.042 I load_tensors:   CPU_Mapped model buffer size =     0.63 MiB
0.00.020.043 I load_tensors:   CPU_REPACK model buffer size =     0.17 MiB
0.00.114.665 I cmn  common_init_: warming up the model with an empty run - please wait ... \
(--no-warmup to disable)
0.00.135.795 I srv  llama_server: model loaded
0.00.135.814 I srv  llama_server: listening on http://127.0.0.1:48435
0.00.135.939 I srv  update_slots: all slots are idle
"""

GDB_BACKTRACE = """\
Thread 1 "llama-server" received signal SIGSEGV, Segmentation fault.
#0  0x00007ffff7a1b2c4 in ggml_backend_amx_mul_mat (params=0x7fffffffc0e0, dst=0x5555) \
at ggml/src/ggml-cpu/amx/mmq.cpp:2380
#1  0x00007ffff7a0f1de in ggml_compute_forward_mul_mat () from libggml-cpu.so
#2  ggml_graph_compute_thread (data=0x55555) at ggml/src/ggml-cpu/ggml-cpu.c:2930
"""

ABORT_BACKTRACE = """\
/src/ggml/src/ggml.c:229: GGML_ASSERT(nb % 32 == 0) failed
0: 0x7f00 ggml_print_backtrace
1: 0x7f01 ggml_abort
2: 0x7f02 ggml_vec_dot_q4_0_q8_0
3: 0x7f03 ggml_compute_forward_mul_mat
"""

AMX_HOST = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "sse2"})


def test_amx_startup_crash_names_signal_symbol_and_amx_facts():
    report = crash_report("startup", exit_code=-11, log_text=AMX_CRASH_LOG, host_flags=AMX_HOST)
    assert report.signal == "SIGSEGV"
    assert report.backtrace_symbol == "ggml_backend_amx_mul_mat"
    assert report.cpu_features["AMX_INT8"] == "1" and report.repack is True
    assert report.amx_buffer and report.host_amx and report.amx_suspected
    assert report.stage == "warm-up"
    sentence = report.sentence()
    for words in (
        "crashed with SIGSEGV during startup (warm-up)",
        "ggml_backend_amx_mul_mat",
        "AMX_INT8 = 1",
        "REPACK = 1",
        "AMX model buffer size = 0.17 MiB",
        "amx_int8, amx_tile",
        "--no-repack",
        "llama.cpp#20824",
    ):
        assert words in sentence
    data = report.to_dict()
    assert data["host_cpu_flags"] == ["amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512f"]
    assert data["backtrace"][:2] == ["ggml_backend_amx_mul_mat", "ggml_graph_compute"]


def test_shell_exit_139_is_sigsegv_and_plain_codes_are_not_signals():
    assert signal_name(139) == "SIGSEGV"
    assert signal_name(-6) == "SIGABRT"
    assert signal_name(-9) == "SIGKILL"
    assert signal_name(1) is None and signal_name(0) is None and signal_name(None) is None
    report = crash_report("startup", exit_code=1, log_text="error: unknown argument: --bogus\n")
    assert report.signal is None and not report.amx_suspected
    assert report.sentence().startswith("llama-server exited with code 1 during startup")


def test_no_amx_host_log_is_not_blamed_on_amx():
    report = crash_report(
        "mid-request",
        exit_code=-9,
        log_text=NO_AMX_LOG,
        host_flags=parse_cpu_flags("flags\t: fpu sse2 avx2 avx512f\n"),
    )
    assert report.signal == "SIGKILL" and report.stage == "serving"
    assert report.cpu_features.get("AMX_INT8") is None and report.repack is True
    assert not report.amx_suspected and report.backtrace_symbol is None
    sentence = report.sentence()
    assert "in the middle of a request" in sentence and "no AMX" in sentence
    assert "--no-repack" not in sentence


def test_log_without_system_info_says_repack_unknown():
    report = crash_report("startup", exit_code=-11, log_text="main: loading model\n")
    assert report.cpu_features == {} and report.repack is None
    assert "system_info" not in report.sentence()


def test_gdb_and_ggml_unwinder_backtraces_give_the_crashing_frame():
    assert backtrace_frames(GDB_BACKTRACE.splitlines())[:3] == [
        "ggml_backend_amx_mul_mat",
        "ggml_compute_forward_mul_mat",
        "ggml_graph_compute_thread",
    ]
    # The reporter's own frames (print_backtrace, abort) are not the crash.
    assert crash_symbol(backtrace_frames(ABORT_BACKTRACE.splitlines())) == "ggml_vec_dot_q4_0_q8_0"
    report = crash_report("mid-request", exit_code=-6, log_text=ABORT_BACKTRACE)
    assert report.signal == "SIGABRT" and report.backtrace_symbol == "ggml_vec_dot_q4_0_q8_0"
    assert not report.amx_suspected


def test_hang_report_has_no_exit_code_and_says_what_was_waited_for():
    report = crash_report(
        "hang", log_text=NO_AMX_LOG, detail="a request got no complete answer within 2s"
    )
    assert report.exit_code is None and report.signal is None
    assert report.sentence().startswith(
        "llama-server hung (serving): a request got no complete answer within 2s"
    )


def test_phase_must_be_known():
    with pytest.raises(ValueError, match="phase must be one of startup, mid-request, hang"):
        crash_report("exploded")


def test_system_info_skips_thread_counts():
    features = system_info_features(NO_AMX_LOG.splitlines())
    assert "n_threads" not in features and features["AVX512"] == "1"
    assert list(features)[0] == "SSE3"


def test_host_flags_from_cpuinfo_file_or_env_override(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu sse2 amx_tile amx_int8\n\n"
        "processor\t: 1\nflags\t\t: fpu sse2 amx_tile amx_int8\n"
    )
    flags = host_cpu_flags(cpuinfo, env={})
    assert flags == {"fpu", "sse2", "amx_tile", "amx_int8"} and host_has_amx(flags)
    assert host_cpu_flags(cpuinfo, env={"TRIAGE_CPU_FLAGS": "avx2,fma"}) == {"avx2", "fma"}
    assert not host_has_amx(host_cpu_flags(cpuinfo, env={"TRIAGE_CPU_FLAGS": ""}))
    assert host_cpu_flags(tmp_path / "missing", env={}) == frozenset()
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert host_cpu_flags(arm, env={}) == {"fp", "asimd", "sve"}


def test_read_log_is_bounded_to_head_and_tail(tmp_path: Path):
    log = tmp_path / "server.log"
    middle = "".join(f"slot update {i}\n" for i in range(100_000))  # ~1.7 MB of trace
    log.write_text(NO_AMX_LOG + middle + "segfault here\n")
    text = read_log(log)
    assert len(text) <= 512 * 1024
    report = crash_report("mid-request", exit_code=-11, log_text=text)
    assert report.cpu_features["REPACK"] == "1"  # from the head
    assert report.log_tail[-1] == "segfault here"  # from the tail
    assert read_log(tmp_path / "nope.log") == ""


def test_long_log_lines_are_clipped_in_the_tail():
    report = crash_report("startup", exit_code=-11, log_text="x" * 5000 + "\n")
    assert len(report.log_tail[0]) < 500


def test_workaround_note_names_flag_and_upstream_issue():
    assert AMX_WORKAROUND_NOTE == "host workaround: --no-repack (AMX host, llama.cpp#20824)"


# What b11434 prints for a missing draft model (measured) and for a typo'd flag.
DRAFT_MISSING_LOG = """\
0.00.022.617 I srv    load_model: loading model '/tmp/drill/qat.gguf'
0.00.414.869 E llama_model_load: error loading model: llama_model_loader: failed to load model \
from /nope.gguf
0.00.414.889 E llama_model_load_from_file_impl: failed to load model
0.00.414.892 E srv    load_model: failed to load draft model, '/nope.gguf'
0.00.418.080 E srv  llama_server: exiting due to model loading error
"""


def test_first_error_line_is_named_for_a_plain_exit():
    report = crash_report("startup", exit_code=1, log_text=DRAFT_MISSING_LOG)
    assert report.errors[0].startswith("llama_model_load: error loading model")
    assert len(report.errors) == 4
    assert report.sentence().startswith(
        "llama-server exited with code 1 during startup (model load) (first error: "
        '"llama_model_load: error loading model: llama_model_loader: failed to load model '
        'from /nope.gguf")'
    )
    typo = crash_report("startup", exit_code=1, log_text="error: invalid argument: --bogus\n")
    assert typo.errors == ("error: invalid argument: --bogus",)
    assert crash_report("startup", exit_code=1, log_text=NO_AMX_LOG).errors == ()
