"""Every GPU gets a step time: a calibration derived from its datasheet, a generic node, labelled sources."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.inputs.presets import gpu_names, load_gpu, presets_dir
from memcalc.time.datasheet import generic_cluster, gpu_machine, nearest
from memcalc.time.hardware import calibration_names

JOB = dict(model="llama-3-8b", seq_len=4096, micro_batch=1)
runner = CliRunner()


def _precision(key: str) -> str:
    return "bf16-mixed" if load_gpu(key).bf16_tflops else "fp16-mixed"  # V100, T4: no bf16 tensor cores


@pytest.mark.parametrize("key", gpu_names())
def test_every_shipped_gpu_times_a_step(key):
    r = memcalc.estimate(gpu=key, precision=_precision(key), **JOB)
    assert r.time is not None and r.time.step_s > 0 and r.time.tokens_per_s > 0
    assert 0 < r.time.mfu < 1
    assert r.time.calibration and set(r.time.efficiency_sources) == {
        "hbm", "gemm", "attention", "optimizer", "cross_entropy", "intra_node", "network"}  # fmt: skip
    assert any(n.startswith("step-time efficiencies:") for n in r.notes)


def test_a_faster_gpu_takes_less_time_for_the_same_job():
    step = {g: memcalc.estimate(gpu=g, precision="fp16-mixed", **JOB).time.step_s
            for g in ("h100", "a100", "t4", "b200", "l40s", "v100")}  # fmt: skip
    assert step["b200"] < step["h100"] < step["a100"] < step["t4"]
    assert step["a100"] < step["l40s"] < step["t4"] and step["v100"] < step["t4"]


@pytest.mark.parametrize("key", sorted(set(gpu_names()) - set(calibration_names())))
def test_a_derived_calibration_keeps_the_datasheet_peaks(key):
    g, cal = load_gpu(key), gpu_machine(key).calibration
    sheet = {d: getattr(g, f"{d}_tflops") for d in ("bf16", "fp16", "fp8", "tf32")}
    assert dict(cal.peak_flops) == {d: v * 1e12 for d, v in sheet.items() if v}  # a dtype at 0 or absent is absent
    assert cal.hbm_peak_bytes_per_s == g.hbm_gbps * 1e9
    assert cal.basis.startswith(f"derived: {key}'s datasheet") and nearest(g)[0] in cal.basis
    assert all(label.startswith("datasheet: borrowed from") for _, label in cal.sources)


def test_absent_dtypes_stay_absent():
    assert {d for d, _ in gpu_machine("t4").calibration.peak_flops} == {"fp16"}
    assert {d for d, _ in gpu_machine("v100").calibration.peak_flops} == {"fp16"}
    assert {d for d, _ in gpu_machine("a10g").calibration.peak_flops} == {"bf16", "fp16", "tf32"}
    assert "fp8" in dict(gpu_machine("l40s").calibration.peak_flops)


def test_the_nearest_measured_gpu_by_generation():
    assert nearest(load_gpu("h100-nvl"))[0] == "h100-sxm" and nearest(load_gpu("gb200"))[0] == "b200"
    assert nearest(load_gpu("a10g"))[0] == "a100-sxm-80gb" and nearest(load_gpu("rtx-3090"))[0] == "a100-sxm-80gb"
    ada, amd = nearest(load_gpu("l40s")), nearest(load_gpu("mi300x"))
    assert ada[0] == "a100-sxm-80gb" and "Ada" in ada[1]
    assert amd[0] == "h100-sxm" and "no AMD calibration" in amd[1]
    t4 = nearest(load_gpu("t4"))
    assert t4[0] == "a100-sxm-80gb" and "Turing" in t4[1]
    # No generation given: the calibrated GPU nearest in dense peak (log scale), and the reason says so.
    assert nearest({"bf16_tflops": 900})[0] == "h100-sxm" and nearest({"fp16_tflops": 200})[0] == "a100-sxm-80gb"
    far = nearest({"bf16_tflops": 4000, "architecture": "rubin"})
    assert far[0] == "b200" and "generation 'rubin' unknown" in far[1]


def test_source_labels_say_measured_published_or_datasheet():
    h100 = dict(gpu_machine("h100").calibration.sources)
    assert h100["gemm"].startswith("measured:") and "h100-kernels.md" in h100["gemm"]
    assert h100["network"].startswith("published:") and "nccl-tests#290" in h100["network"]
    a100 = dict(gpu_machine("a100").calibration.sources)
    assert a100["attention"].startswith("published:") and "2307.08691" in a100["attention"]
    assert a100["gemm"].startswith("published: h100-sxm's measured curve x 1.082") and "MAMF" in a100["gemm"]
    h200 = dict(gpu_machine("h200").calibration.sources)  # extends h100-sxm: every curve borrowed, the origin named
    assert h200["gemm"] == f"datasheet: borrowed from h100-sxm ({h100['gemm']})"
    l40s = dict(gpu_machine("l40s").calibration.sources)
    assert l40s["attention"].startswith("datasheet: borrowed from a100-sxm-80gb (published:")


def test_generic_nodes_from_the_gpu_file():
    pcie = gpu_machine("l40s").cluster
    assert (pcie.key, pcie.gpus_per_node, pcie.intra_node.name) == ("l40s-node", 8, "pcie4")
    assert pcie.intra_node.bandwidth == 32e9  # 64 GB/s both directions -> 32 per direction
    assert pcie.network.bandwidth == 6.25e9  # the file's 400 Gb/s per 8 GPUs
    assert gpu_machine("gb200").cluster.gpus_per_node == 72  # one NVL72 NVLink domain
    assert gpu_machine("h100").cluster.key == "dgx-h100"  # a GPU with a cluster preset keeps it
    assert gpu_machine("h100-sxm-hbm2e-500w").cluster.key == "grand-teton-h100"


def _toml(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else f'"{v}"' if isinstance(v, str) else repr(v)


def _user_gpu(tmp_path: Path, name: str, drop=(), **changes) -> Path:
    """The L40S preset as a user's own file, less its aliases and the keys in ``drop``, with ``changes``."""
    lines = []
    for line in (presets_dir() / "gpus" / "l40s.toml").read_text().splitlines():
        key = line.split("=")[0].strip()
        if key == "aliases" or key in drop:
            continue
        lines.append(f"{key} = {_toml(changes.pop(key))}" if key in changes else line)
    lines += [f"{k} = {_toml(v)}" for k, v in changes.items()]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_users_gpu_file_gets_a_step_time(tmp_path):
    mine = memcalc.estimate(gpu=str(_user_gpu(tmp_path, "my-card")), **JOB).time
    shipped = memcalc.estimate(gpu="l40s", **JOB).time
    assert mine.cluster == "my-card-node" and mine.step_s == shipped.step_s
    faster = memcalc.estimate(gpu=str(_user_gpu(tmp_path, "fast", hbm_gbps=1728)), **JOB).time
    assert faster.step_s < mine.step_s
    # The user's own file named like a shipped preset is derived from its own figures, not the preset's calibration.
    h100 = memcalc.estimate(gpu=str(_user_gpu(tmp_path, "h100-sxm", architecture="hopper")), **JOB).time
    assert h100.cluster == "h100-sxm-node" and h100.peak_tflops_per_gpu == 362
    # No network in the file: the generation's default (one 400 Gb/s NDR NIC per GPU for Hopper).
    hopper = gpu_machine(load_gpu(str(_user_gpu(tmp_path, "nonet", drop=("network_gbps",), architecture="hopper"))))
    assert hopper.cluster.network.bandwidth == 50e9 and "hopper's default, one NDR NIC per GPU" in hopper.cluster.name
    other = gpu_machine(load_gpu(str(_user_gpu(tmp_path, "other", drop=("network_gbps", "architecture")))))
    assert other.cluster.network.bandwidth == 100e9 / 8 and "typical cloud NIC (assumed)" in other.cluster.name


def test_a_gpu_file_without_the_clock_still_answers_memory(tmp_path):
    bare = tmp_path / "bare.toml"
    bare.write_text('name = "Mystery card"\nmemory_gb = 48\nusable_memory_gib = 44\n')
    r = memcalc.estimate(gpu=str(bare), **JOB)
    assert r.time is None and r.memory.per_gpu.total > 0
    why = next(n for n in r.notes if n.startswith("step time:"))
    assert "hbm_gbps, intra_node_gbps, a tensor-core rate" in why and "memory alone is answered" in why
    zero = memcalc.estimate(gpu=str(_user_gpu(tmp_path, "zero", hbm_gbps=0)), **JOB)
    assert zero.time is None and any("hbm_gbps above 0 (it is 0)" in n for n in zero.notes)
    with pytest.raises(InputError, match="--tokens needs a step time: .*hbm_gbps"):
        memcalc.estimate(gpu=str(bare), tokens=1e9, **JOB)


def _cli(*args):
    return runner.invoke(app, ["estimate", "--model", "llama-3-8b", "--seq-len", "4096", *args])


def test_cli_bad_time_input_is_one_line_exit_2(tmp_path):
    bare = tmp_path / "bare.toml"
    bare.write_text('name = "Mystery card"\nmemory_gb = 48\nusable_memory_gib = 44\n')
    no_fp8 = _user_gpu(tmp_path, "no-fp8", drop=("fp8_tflops",), fp8=False)
    for args, message in [
        (("--gpu", str(bare), "--tokens", "1e9"), "hbm_gbps, intra_node_gbps"),
        (("--gpu", str(bare), "--network-gbits", "100"), "--network-gbits needs a step time"),
        (("--gpu", str(_user_gpu(tmp_path, "z", intra_node_gbps=0)), "--tokens", "1e9"), "intra_node_gbps above 0"),
        (("--gpu", "l40s", "--intra-node-efficiency", "1.5"), "out of bounds; accepted: more than 0 and at most 1"),
        (("--gpu", "l40s", "--network-efficiency", "-0.1"), "out of bounds; accepted: more than 0 and at most 1"),
        (("--gpu", "l40s", "--intra-node-gbps", "0"), "--intra-node-gbps 0.0 is out of bounds"),
        (("--gpu", "t4", "--tokens", "1e9"), "computes in bf16, which NVIDIA T4 (t4) does not run"),
        (("--gpu", "t4", "--precision", "fp16-mixed", "--float8", "tensorwise"), "needs fp8 tensor cores"),
        (("--gpu", "a10g", "--float8", "tensorwise"), "needs fp8 tensor cores"),
        (("--gpu", str(no_fp8), "--float8", "tensorwise"), "needs fp8 tensor cores"),
    ]:  # fmt: skip
        r = _cli(*args)
        assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    r = _cli("--gpu", str(bare))
    assert r.exit_code == 0 and "memory alone is answered" in r.stdout


def test_cli_times_any_gpu(tmp_path):
    for gpu in ("l40s", str(_user_gpu(tmp_path, "mine"))):
        r = _cli("--gpu", gpu, "--verbose")  # the step-time efficiencies' sources: a note under --verbose
        assert r.exit_code == 0 and "tokens/s" in r.stdout and "borrowed from" in r.stdout, r.output
    r = _cli("--gpu", "v100")  # bf16 on a GPU without it: refused, naming the precisions it runs
    assert r.exit_code == 2 and "accepted on it: fp32, fp16-mixed, amp-fp16" in r.stderr
    r = _cli("--gpu", "v100", "--precision", "fp16-mixed")
    assert r.exit_code == 0 and "tokens/s" in r.stdout


def test_the_catalogue_lists_the_new_presets():
    r = runner.invoke(app, ["gpus", "--format", "csv"])
    assert r.exit_code == 0
    for key in ("h100-nvl", "h100-pcie", "h100-sxm-hbm2e-500w", "gb200", "rtx-3090", "rtx-a6000", "a10g", "t4"):
        assert f"\n{key}," in r.stdout
    assert len(gpu_names()) >= 23
