import pytest

import memcalc


@pytest.fixture
def est():
    """memcalc.estimate with no CUDA context, so totals are model states alone (as the ZeRO paper counts)."""

    def run(**kwargs):
        kwargs.setdefault("cuda_context_gib", 0)
        return memcalc.estimate(**kwargs)

    return run
