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


def test_durations_take_one_unit_per_column():
    from memcalc.units import format_duration, format_time, time_unit

    assert time_unit(7.426) == "s" and time_unit(1.0) == "s" and time_unit(0.587) == "ms"
    assert format_time(0.009231, "s") == "0.009" and format_time(0.009231, "ms") == "9.23"
    assert format_time(1234.5, "s") == "1,234.500"
    assert format_duration(36_000) == "10.0 hours" and format_duration(59) == "59.0 s"
    assert format_duration(3 * 86400) == "3.0 days"


def test_text_in_gb_converts_every_gib_figure_and_leaves_flags():
    from memcalc.units import text_in_unit

    text = "margin -75.82 GiB; at-risk under 9.31 GiB, 1,024 GiB, 0.3 GiB (--reserve-gib, --cuda-context-gib 0.5)"
    assert text_in_unit(text, "gib") == text
    # 75.82 GiB = 81.41 GB (x 2**30 / 10**9 = 1.073741824); 1,024 GiB = 1,100 GB to no decimals; 0.3 GiB = 0.3 GB
    assert text_in_unit(text, "gb") == ("margin -81.41 GB; at-risk under 10.00 GB, 1,100 GB, 0.3 GB "
                                        "(--reserve-gib, --cuda-context-gib 0.5)")  # fmt: skip
    assert text_in_unit("4 MiB x 16 channels, v1.5 GiBs", "gb") == "4 MiB x 16 channels, v1.5 GiBs"
