import math

import pytest

from memcalc.errors import InputError
from memcalc.units import GB, GiB, ceil_div, format_count, format_memory, parse_count, to_memory_unit


@pytest.mark.parametrize(
    "text, count",
    [
        ("175e9", 175_000_000_000),
        ("175B", 175_000_000_000),
        ("7b", 7_000_000_000),
        ("1.3e9", 1_300_000_000),
        ("350M", 350_000_000),
        ("1.5T", 1_500_000_000_000),
        ("125k", 125_000),
        (" 6.7B ", 6_700_000_000),
        ("124439808", 124_439_808),
        (7_000_000_000, 7_000_000_000),
        (1.3e9, 1_300_000_000),
    ],
)
def test_parse_count_accepts_what_people_write(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["0", "-5", "nan", "inf", "-inf", "abc", "", "7 bn", "1.5", "0.4", "1e-3", True])
def test_parse_count_rejects_with_the_value_named(text):
    with pytest.raises(InputError) as e:
        parse_count(text, "--params")
    assert "--params" in str(e.value) and repr(text) in str(e.value)
    assert "175e9" in str(e.value)  # says what would be accepted


def test_units_are_labelled_and_exact():
    assert GiB == 1024**3 and GB == 10**9
    assert format_memory(120 * 10**9, "gb") == "120.00 GB"
    assert format_memory(80 * GiB) == "80.00 GiB"
    assert math.isclose(to_memory_unit(120 * 10**9, "gib"), 111.758708953857, rel_tol=1e-12)
    assert format_count(175_000_000_000) == "175.0B"
    assert ceil_div(7, 2) == 4 and ceil_div(8, 2) == 4
