"""Plots: files written are valid PNG/SVG, and the bars and lines carry the estimates' figures."""

import xml.etree.ElementTree as ET

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.report.plot import SEGMENTS, memory_parts, plot_memory, plot_scaling, save
from memcalc.units import GB, GiB

pytest.importorskip("matplotlib")

STRATEGIES = ["ddp", "zero-2", "zero-3+opt-cpu", "FULL_SHARD"]


@pytest.fixture(scope="module")
def comparison():
    return memcalc.compare(model="llama-2-7b", seq_len=1024, micro_batch=1, gpus=8, strategies=STRATEGIES,
                           precision="bf16-mixed")


def _bars(fig) -> dict[str, list[tuple[float, float]]]:
    """Per segment label, the (bottom, height) of each bar."""
    ax = fig.axes[0]
    return {c.get_label(): [(p.get_y(), p.get_height()) for p in c.patches] for c in ax.containers}


def test_bar_heights_equal_the_estimates(comparison):
    fig = plot_memory(comparison)
    bars = _bars(fig)
    assert list(bars) == list(SEGMENTS)
    for i, r in enumerate(comparison.estimates):
        parts = memory_parts(r)
        assert sum(parts.values()) == r.memory.per_gpu.total
        assert parts["optimizer states"] == r.memory.per_gpu.optimizer_states
        top = 0.0
        for segment in SEGMENTS:
            bottom, height = bars[segment][i]
            assert height == pytest.approx(parts[segment] / GiB, rel=1e-12)
            assert bottom == pytest.approx(top, rel=1e-12)
            top += height
        assert top == pytest.approx(r.memory.per_gpu.total / GiB, rel=1e-12)
    ax = fig.axes[0]
    # each bar its strategy, marked with its accounting where the rows take two (DDP in bf16-mixed: the paper's)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        r.strategy.label + (" (paper)" if r.accounting == "paper" else "") for r in comparison.estimates]
    assert {r.accounting for r in comparison.estimates} == {"paper", "realistic"}
    (capacity,) = [line for line in ax.get_lines() if line.get_label().startswith("usable on")]
    assert capacity.get_ydata()[0] == pytest.approx(comparison.estimates[0].memory.fit.usable_bytes / GiB)
    assert ax.get_ylabel() == "memory per GPU (GiB)"


def test_one_estimate_or_a_list_in_gb(comparison):
    r = comparison.estimates[1]
    fig = plot_memory([r], unit="gb")
    assert _bars(fig)["parameters"][0][1] == pytest.approx(r.memory.per_gpu.parameters / GB)
    assert fig.axes[0].get_ylabel() == "memory per GPU (GB)"
    assert len(_bars(plot_memory(r))["activations"]) == 1


def test_saved_files_are_valid_png_and_svg(comparison, tmp_path):
    fig = plot_memory(comparison)
    png = save(fig, tmp_path / "memory.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    svg = save(fig, tmp_path / "memory.SVG")
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    with pytest.raises(InputError, match=r"has the suffix '.pdf'; accepted: .png, .svg"):
        save(fig, tmp_path / "memory.pdf")
    with pytest.raises(InputError, match="cannot be written"):
        save(fig, tmp_path / "missing" / "memory.png")


def test_scaling_lines_follow_the_estimates(tmp_path):
    gpus = [8, 16, 64]
    fig = plot_scaling(params=7e9, strategies=["ddp", "zero-3"], gpus=gpus)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    for name, label in (("ddp", "DDP"), ("zero-3", "ZeRO-3")):
        expected = [memcalc.estimate(params=7e9, strategy=name, gpus=n).memory.per_gpu.total / GiB for n in gpus]
        assert list(lines[label].get_xdata()) == gpus
        assert list(lines[label].get_ydata()) == pytest.approx(expected, rel=1e-12)
    # DDP does not shard: flat at 16Ψ + context; ZeRO-3 at 16Ψ/N + context (ZeRO paper §5, Table 1).
    assert list(lines["DDP"].get_ydata()) == pytest.approx([(16 * 7e9 + GiB / 2) / GiB] * 3)
    assert list(lines["ZeRO-3"].get_ydata()) == pytest.approx([(16 * 7e9 / n + GiB / 2) / GiB for n in gpus])
    capacity = [line for label, line in lines.items() if label.startswith("usable on")]
    assert len(capacity) == 1 and capacity[0].get_ydata()[0] == pytest.approx(79.15)
    assert ax.get_xscale() == "log"
    svg = save(fig, tmp_path / "scaling.svg")
    ET.parse(svg)


@pytest.mark.parametrize("gpus", [[], [0], [8, "16"], [True]])
def test_bad_inputs_are_refused(gpus, comparison):
    with pytest.raises(InputError, match="gpus .* is not accepted"):
        plot_scaling(params=7e9, gpus=gpus)
    with pytest.raises(InputError, match="cannot plot"):
        plot_memory([])
    with pytest.raises(InputError, match="unit 'tb' is not accepted"):
        plot_memory(comparison, unit="tb")


def test_time_plot_stacks_the_step_breakdown():
    import memcalc
    from memcalc.report.plot import plot_time, time_parts

    cmp = memcalc.compare(model="llama-3-8b", gpus=64, gpu="h100", seq_len=4096, strategies=["ddp", "zero-3"])
    fig = plot_time(cmp)
    ax = fig.axes[0]
    tops: dict[float, float] = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    for i, e in enumerate(cmp.estimates):
        assert tops[i] == pytest.approx(e.time.step_s)
        assert sum(time_parts(e).values()) == pytest.approx(e.time.step_s)
    with pytest.raises(InputError, match="has no step time"):
        plot_time(memcalc.estimate(params=7e9, gpus=8))


def test_figures_show_inline_in_a_notebook():
    import memcalc
    from memcalc.report.plot import plot_memory

    png = plot_memory(memcalc.compare(params=7e9, gpus=8, strategies=["ddp", "zero-3"]))._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"  # what Jupyter shows for the last expression of a cell
