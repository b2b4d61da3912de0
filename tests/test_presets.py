import tomllib
from pathlib import Path

import pytest

import memcalc
from memcalc.errors import InputError
from memcalc.inputs.presets import load_gpu, presets_dir

GPU_FILES = sorted((presets_dir() / "gpus").glob("*.toml"))
REQUIRED = {"a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm", "h100-pcie", "h200",
            "b200", "v100-16gb", "v100-32gb", "a10", "l4", "l40s", "rtx-4090", "mi250x", "mi300x"}  # fmt: skip


def test_catalogue_is_complete():
    assert REQUIRED <= {p.stem for p in GPU_FILES}


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.stem)
def test_every_preset_loads_and_cites_its_source(path):
    g = load_gpu(path.stem)
    assert g.key == path.stem
    assert g.usable_memory_gib < g.memory_gb  # GiB usable is always below the decimal GB sold
    assert g.usable_memory_gib > 0.9 * g.memory_gb * 1e9 / 2**30
    assert path.read_text().startswith("# ") and "Source:" in path.read_text() and g.source
    assert set(tomllib.loads(path.read_text())) <= set(memcalc.GPU.field_names())  # keys equal field names
    for alias in g.aliases:
        assert load_gpu(alias).key == g.key


@pytest.mark.parametrize(
    "name, key, memory_gb, bf16",
    [("a100-80g", "a100-sxm-80gb", 80, 312), ("A100_40G", "a100-sxm-40gb", 40, 312), ("h100", "h100-sxm", 80, 989),
     ("h200", "h200", 141, 989), ("v100", "v100-32gb", 32, 0), ("4090", "rtx-4090", 24, 165.2),
     ("mi300x", "mi300x", 192, 1307.4), ("b200", "b200", 180, 2250)],
)  # fmt: skip
def test_datasheet_figures(name, key, memory_gb, bf16):
    g = load_gpu(name)
    assert (g.key, g.memory_gb, g.bf16_tflops) == (key, memory_gb, bf16)


def test_default_gpu_is_a100_sxm_80gb():
    assert memcalc.estimate(params=1e9).input.gpu.key == "a100-sxm-80gb"


def test_unknown_gpu_suggests_and_lists():
    with pytest.raises(InputError) as e:
        load_gpu("a100-81g")
    msg = str(e.value)
    assert "did you mean 'a100-80g'" in msg and "h100-sxm" in msg and "\n" not in msg


def test_user_preset_by_path(tmp_path: Path):
    src = (presets_dir() / "gpus" / "a100-sxm-80gb.toml").read_text()
    mine = tmp_path / "my-gpu.toml"
    mine.write_text(src.replace("usable_memory_gib = 79.15", "usable_memory_gib = 10"))
    r = memcalc.estimate(params=7e9, stage=3, gpus=8, gpu=str(mine))
    assert r.input.gpu.key == "my-gpu" and r.memory.fit.usable_bytes == 10 * 2**30


def test_bad_user_preset_is_one_clear_line(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmemory_gb = -1\n')
    with pytest.raises(InputError, match="bad.toml"):
        load_gpu(str(bad))
    with pytest.raises(InputError, match="does not exist"):
        load_gpu(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("kind", ["gpus", "models", "clusters", "calibration"])
def test_lookup_reads_only_what_it_must_and_agrees_with_the_index(kind, monkeypatch):
    """``find`` (which parses only the files whose text can hold the name) gives the file the full alias index gives,
    for every shipped name and alias, in every spelling the index accepts; and it parses one file for an alias."""
    from memcalc.inputs import presets

    index = presets._alias_index(kind)
    assert index
    for key, path in index.items():
        for spelling in (key, key.upper(), key.replace("-", "_"), f"  {key} "):
            presets.find.cache_clear()
            assert presets.find(kind, spelling) == path, spelling
    presets.find.cache_clear()
    assert presets.find(kind, "no-such-preset-anywhere") is None
    aliases = [k for k, p in index.items() if presets._norm(p.stem) != k]
    if aliases:
        parsed = []
        real = presets._read
        monkeypatch.setattr(presets, "_read", lambda p: parsed.append(p) or real(p))
        presets.find.cache_clear()
        assert presets.find(kind, aliases[0]) == index[aliases[0]]
        assert parsed[-1] == index[aliases[0]]
        assert len(parsed) < len(list((presets_dir() / kind).glob("*.toml")))
    presets.find.cache_clear()
