"""The first ten minutes: what a newcomer sees first (the concise estimate, notebook display, ``dir(memcalc)``)."""

from __future__ import annotations

import re

import memcalc


def test_dir_lists_the_public_api_and_nothing_else():
    memcalc.estimate  # noqa: B018 (a lazy import puts memcalc.api and others in the module's namespace)
    assert dir(memcalc) == sorted(memcalc.__all__)
    assert "estimate" in dir(memcalc) and "InputError" in dir(memcalc)
    assert not {"api", "TYPE_CHECKING", "Any", "annotations", "_EXPORTS"} & set(dir(memcalc))
    for name in memcalc.__all__:  # every name listed resolves
        assert getattr(memcalc, name) is not None


def test_notebook_html_is_a_fragment_no_wider_than_the_notebook():
    for result in (memcalc.estimate(model="llama-3-8b", seq_len=2048, precision="amp-bf16"),
                   memcalc.compare(params=7e9, gpus=8, strategies=["zero-2", "zero-3"])):
        page = result._repr_html_()
        assert page == result._repr_mimebundle_()["text/html"]
        assert not re.search(r"<(!DOCTYPE|html|head|body|style)\b", page, re.IGNORECASE), page[:200]
        outer = re.match(r'<div class="memcalc" style="([^"]*)">', page)
        assert outer is not None and "max-width:100%" in outer[1] and "overflow:auto" in outer[1]
        assert page.endswith("</div>")
        assert not re.search(r"width:\s*\d+(px|em|ch)", page)  # no fixed width anywhere
        assert not re.search(r"background", page)  # the notebook's own background, light or dark
        total = f"{result.estimates[0].memory.per_gpu.total / 2**30:,.2f}" if hasattr(result, "estimates") else \
            f"{result.memory.per_gpu.total / 2**30:,.2f}"
        assert total in re.sub(r"<[^>]+>", "", page)
