import os

import pytest

import memcalc

# No test reaches the network: a Hub id given to --hf-config (tests/test_hf_hub.py serves its own Hub locally, and
# the fuzz tests' random text can read as one) is answered from the cache or refused, never fetched.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture
def est():
    """memcalc.estimate with no CUDA context, so totals are model states alone (as the ZeRO paper counts)."""

    def run(**kwargs):
        kwargs.setdefault("cuda_context_gib", 0)
        return memcalc.estimate(**kwargs)

    return run
