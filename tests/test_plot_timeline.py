"""memcalc plot timeline: the bands carry each moment's bytes by kind, the peak marker sits on peak_allocated, and
an estimate the realistic accounting does not replay is one line, exit 2."""

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.report.plot_timeline import phase_spans, plot_timeline
from memcalc.units import GiB

pytest.importorskip("matplotlib")
runner = CliRunner()
FSDP2 = dict(model="llama-3-8b", fsdp="FULL_SHARD", fsdp_version=2, gpus=8, seq_len=2048, gpu="h100")
ARGS = ["--model", "llama-3-8b", "--fsdp", "FULL_SHARD", "--fsdp-version", "2", "--gpus", "8", "--seq-len", "2048",
        "--gpu", "h100"]


@pytest.fixture(scope="module")
def estimate():
    return memcalc.estimate(**FSDP2, timeline=True)


def test_the_stack_tops_are_the_moments_totals_and_the_peak_is_marked(estimate):
    fig = plot_timeline(estimate)
    ax = fig.axes[0]
    moments = estimate.memory.timeline.moments
    kinds = [c for c in ax.collections if c.get_label() != "allocator cached"]
    tops = [max(p[1] for p in c.get_paths()[0].vertices) for c in kinds]
    assert max(tops) == pytest.approx(estimate.memory.per_gpu.peak_allocated / GiB)
    cached = next(c for c in ax.collections if c.get_label() == "allocator cached")  # up to the reserved peak
    ys = [p[1] for p in cached.get_paths()[0].vertices]
    assert max(ys) == pytest.approx(estimate.memory.per_gpu.peak_reserved / GiB)
    assert min(ys) == pytest.approx(min(sum(m.bytes.values()) for m in moments) / GiB)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:4] == ["parameters", "gradients", "optimizer states", "activations"]
    peak = next(line for line in ax.lines if line.get_label().startswith("peak "))
    assert peak.get_ydata()[0] == pytest.approx(estimate.memory.per_gpu.peak_allocated / GiB)
    assert moments[int(peak.get_xdata()[0])].label == estimate.memory.timeline.peak_moment
    usable = [line for line in ax.lines if line.get_label().startswith("usable")]
    assert usable[0].get_ydata()[0] == pytest.approx(estimate.memory.fit.usable_bytes / GiB)
    names = {t.get_text() for t in ax.texts}
    assert {"forward", "loss", "backward", "optimizer"} <= names
    assert "allocator cached" in ax.get_xlabel()


def test_phase_spans_fold_the_layers_and_cover_every_moment(estimate):
    moments = estimate.memory.timeline.moments
    spans = phase_spans(moments)
    assert [g for g, _, _ in spans] == ["baseline", "input", "forward", "loss", "backward", "optimizer", "zero_grad"]
    assert spans[0][1] == 0 and spans[-1][2] == len(moments) - 1
    assert all(b[1] == a[2] + 1 for a, b in zip(spans, spans[1:]))


def test_an_estimate_without_moments_is_refused():
    with pytest.raises(InputError, match="timeline=True"):
        plot_timeline(memcalc.estimate(**FSDP2))
    with pytest.raises(InputError, match="realistic accounting"):
        plot_timeline(memcalc.estimate(params=7e9, gpus=8))


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_command_writes_the_picture(tmp_path, suffix):
    out = tmp_path / f"timeline{suffix}"
    r = runner.invoke(app, ["plot", "timeline", *ARGS, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("args", [
    ["timeline", "--params", "7e9"],  # no layers to replay
    ["timeline", "--model", "llama-3-8b", "--seq-len", "2048", "--precision", "bf16-mixed"],  # DDP with a master copy
    ["timeline", *ARGS, "--strategies", "ddp,zero-3"],
    ["memory", *ARGS],  # --fsdp: one strategy's flag
])
def test_what_cannot_be_drawn_is_one_line_exit_2(tmp_path, args):
    r = runner.invoke(app, ["plot", *args, "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1
