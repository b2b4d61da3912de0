"""Preset files are read without tomllib where they are flat, and read exactly as tomllib reads them."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc.inputs.presets import _flat_toml, find, load_gpu, presets_dir

KINDS = ("gpus", "models", "clusters", "calibration")


@pytest.mark.parametrize("kind", KINDS)
def test_every_shipped_preset_reads_as_tomllib_reads_it(kind: str) -> None:
    files = sorted((presets_dir() / kind).glob("*.toml"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        flat = _flat_toml(text)
        assert flat is not None, path.name  # the shipped presets take the fast path
        assert flat == tomllib.loads(text), path.name
        assert [type(v) for v in flat.values()] == [type(v) for v in tomllib.loads(text).values()]


@pytest.mark.parametrize("text", [
    'a = "x\\ty"',            # an escape
    'a = """x"""',            # a multi-line string
    "a = 'x'",                # a literal string
    "a = 1_000",              # an underscore
    "a = +1",                 # a plus sign
    "a = 0x10",               # hexadecimal
    "a = 01",                 # a leading zero (invalid)
    "a = inf",                # a special float
    "a = 1979-05-27",         # a date
    "[table]\na = 1",         # a table
    "a.b = 1",                # a dotted key
    '"a" = 1',                # a quoted key
    "a = 1\na = 2",           # a duplicate key (invalid)
    "a = [1,,2]",             # an empty item (invalid)
    "a = [1 2]",              # no comma (invalid)
    "a = # no value\n1",      # a comment before the value (invalid)
    "a = 1 b = 2",            # two keys on a line (invalid)
    "a = true1",              # junk after a value (invalid)
    'a = "x" "y"',            # two values (invalid)
    "a = 1\r\nb = 2",         # CRLF line ends
    "a = 1 # \x01",           # a control character in a comment (invalid)
    "a =",                    # no value (invalid)
    "= 1",                    # no key (invalid)
    "a = " + "[" * 20 + "]" * 20,  # deep nesting
])  # fmt: skip
def test_anything_else_is_left_to_tomllib(text: str) -> None:
    assert _flat_toml(text) is None


@pytest.mark.parametrize("text", [
    "a = [1,\n  2,  # a comment\n]\n",
    "# top\n\na=1#c\nb = [[1.5e9, 0.5], [2, 0.25]]\nc = \"x # y\"\n",
    "a = []\nb = [ \"x\" , true , -0 ]",
])
def test_flat_presets_over_several_lines_read_as_tomllib_reads_them(text: str) -> None:
    assert _flat_toml(text) == tomllib.loads(text)


_PIECES = st.sampled_from(["a", "b_2", "-", " ", "\t", "=", '"', "x y", "#", "[", "]", ",", "0", "1", "-7", "0.5",
                           "1e3", "2.5E-2", "true", "false", "\\", "'", ".", "_", "+", "\n", "é", "01", "inf"])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=20).map("".join))
def test_what_the_flat_reader_accepts_tomllib_reads_the_same(text: str) -> None:
    flat = _flat_toml(text)
    if flat is not None:
        assert flat == tomllib.loads(text)


def test_an_alias_is_found_reading_only_the_files_that_can_hold_it() -> None:
    assert find("gpus", "h100") == presets_dir() / "gpus" / "h100-sxm.toml"
    assert find("gpus", "A100_80G") == presets_dir() / "gpus" / "a100-sxm-80gb.toml"
    assert find("clusters", "hgx-h100") == presets_dir() / "clusters" / "dgx-h100.toml"
    assert find("gpus", "h10") is None
    assert load_gpu("4090").key == "rtx-4090"
