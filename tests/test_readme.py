"""The examples of README.md and of every docs/*.md page run with this checkout's memcalc and print what the page shows
(docs/readme_examples.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "docs" / "readme_examples.py")
assert _spec is not None and _spec.loader is not None
rx = importlib.util.module_from_spec(_spec)
sys.modules["readme_examples"] = rx  # dataclasses look their module up by name
_spec.loader.exec_module(rx)


@pytest.fixture(scope="module")
def readme_results():
    return rx.run_all(rx.README)


def test_readme_has_memcalc_commands_to_run():
    cmds = [e for e in rx.examples(rx.README.read_text(encoding="utf-8")) if e.kind == "shell"]
    assert any(e.source.startswith("memcalc estimate ") for e in cmds)
    assert any(e.source.startswith("memcalc compare ") for e in cmds)


def test_every_memcalc_command_in_the_readme_exits_as_documented(readme_results):
    for r in readme_results:
        ex = r.example
        if ex.kind != "shell":
            continue
        if ex.expect_error:
            assert r.returncode == 2, f"README line {ex.line}: {ex.source}\n{r.stderr}"
            assert len(r.stderr.rstrip("\n").splitlines()) == 1, f"README line {ex.line}: {r.stderr!r}"
            assert r.stderr.startswith("memcalc: error: "), f"README line {ex.line}: {r.stderr!r}"
            assert r.stdout == ""
        else:
            assert r.returncode == 0, f"README line {ex.line}: {ex.source}\n{r.stderr}"


def test_readme_outputs_are_what_memcalc_prints(readme_results):
    problems = [p for r in readme_results for p in r.problems]
    assert not problems, (
        "README.md is out of date; regenerate with `python docs/readme_examples.py --write`:\n" + "\n".join(problems)
    )


# The checker itself, on a small README of its own.

_SMALL = """\
# demo

```bash
memcalc estimate --params 7.5e9 --stage 1 --gpus 64 --units gb --json  # the ZeRO paper's Figure 1
```

```text
stale
```

<!-- readme: error -->
```bash
memcalc estimate --params 7b --fsdp FULL_SHRD
```

```text
memcalc: error: stale
```

<!-- readme: run -->
```python
import memcalc
memcalc.estimate(params=7.5e9, stage=1, gpus=64, cuda_context_gib=0).memory.per_gpu.total  # {total}
print("ok")
```

```text
ok
```

```console
$ memcalc strategies   # no output shown: an illustration, not run
$ memcalc estimate --params 7b --gpus not-a-number
memcalc: error: stale
```

<!-- readme: skip -->
```bash
memcalc validate --suite full
```
"""

# ZeRO paper Figure 1, P_os (ZeRO-1) at Ψ = 7.5B, N = 64: 4Ψ + 12Ψ/64 bytes = 31.4 GB.
_ZERO1_BYTES = 4 * 7_500_000_000 + 12 * 7_500_000_000 // 64


def _small(tmp_path: Path, total: int = _ZERO1_BYTES) -> Path:
    p = tmp_path / "README.md"
    p.write_text(_SMALL.replace("{total}", f"{total:_}"), encoding="utf-8")
    return p


def test_examples_found_with_their_outputs_and_markers(tmp_path):
    exs = rx.examples(_small(tmp_path).read_text(encoding="utf-8"))
    # the skipped block and the console line with no output under it are not examples
    assert [(e.kind, e.line, e.expect_error, e.output) for e in exs] == [
        ("shell", 4, False, (7, 8)),  # output: the ```text block's one line, 0-based [start, end)
        ("shell", 13, True, (16, 17)),  # marked as an error example
        ("python", 21, False, (27, 28)),
        ("shell", 33, True, (33, 34)),  # a console transcript whose output starts "memcalc: error:"
    ]
    assert exs[3].source == "memcalc estimate --params 7b --gpus not-a-number"


def test_check_names_the_first_difference_then_write_makes_it_clean(tmp_path):
    readme = _small(tmp_path)
    problems = rx.check(readme)
    assert len(problems) == 3  # the JSON and both error lines are stale; the python block matches
    assert problems[0].startswith("README line 8 (output of line 4) differs:\n    README: stale\n    actual: {")
    assert problems[1].startswith("README line 17 (output of line 13) differs:")
    assert "actual: memcalc: error: unknown FSDP sharding strategy 'FULL_SHRD'" in problems[1]
    assert rx.main(["--check", "--readme", str(readme)]) == 1
    assert rx.write(readme) == [8, 17, 34]
    assert rx.check(readme) == []
    assert rx.main(["--check", "--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert '"schema_version": 1' in text and "stale" not in text
    assert rx.write(readme) == []  # nothing left to rewrite


def test_a_wrong_figure_in_a_python_comment_fails(tmp_path):
    problems = rx.check(_small(tmp_path, total=_ZERO1_BYTES + 1))
    wrong = [p for p in problems if p.startswith("README line 21")]
    assert len(wrong) == 1 and "exits 1" in wrong[0]
    assert f"is {_ZERO1_BYTES}; the page says {_ZERO1_BYTES + 1}" in wrong[0]


def test_a_failing_command_is_reported_and_blocks_write(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nmemcalc estimate --params 7b --stage 9\n```\n\n```text\nx\n```\n", encoding="utf-8")
    problems = rx.check(readme)
    assert problems[0].startswith("README line 2: memcalc estimate --params 7b --stage 9: exits 2\n")
    with pytest.raises(SystemExit, match="not written"):
        rx.write(readme)
    assert readme.read_text(encoding="utf-8").endswith("```text\nx\n```\n")


def test_shell_syntax_is_refused_not_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nmemcalc gpus | head -3\n```\n", encoding="utf-8")
    (problem,) = rx.check(readme)
    assert "not shell syntax '|'" in problem


def test_environment_is_fixed_and_wide():
    env = rx.environment(Path("/tmp"))
    assert env["COLUMNS"] == "160" and env["PYTHONPATH"] == str(ROOT)
    assert "FORCE_COLOR" not in env and "JUPYTER_COLUMNS" not in env


def test_a_file_block_is_written_where_the_commands_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- readme: file tiny/config.json -->\n```json\n"
        '{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128}\n'
        "```\n\n```bash\nmemcalc estimate --hf-config tiny/config.json --stage 3 --gpus 8 --json\n```\n",
        encoding="utf-8",
    )
    assert rx.files(readme.read_text(encoding="utf-8")) == {"tiny/config.json": readme.read_text().splitlines()[2] + "\n"}
    (res,) = rx.run_all(readme)
    assert res.returncode == 0 and res.problems == []
    # GPT-2, h = 64, 2 layers, v = 1000, 128 positions: wte 64,000 + wpe 8,192 + 2 x 49,984 per layer
    # (ln 128 + c_attn 12,480 + attn c_proj 4,160 + ln 128 + c_fc 16,640 + mlp c_proj 16,448) + ln_f 128
    assert json.loads(res.stdout)["model"]["parameters"] == 172_288


def test_a_head_marker_shows_the_first_lines_of_each_output(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- readme: head 2 -->\n```bash\nmemcalc gpus\nmemcalc strategies\n```\n\n```text\nx\n```\n",
                      encoding="utf-8")  # fmt: skip
    (a, b) = rx.examples(readme.read_text(encoding="utf-8"))
    assert a.head == b.head == 2 and a.output == b.output == (7, 8)
    assert rx.write(readme) == [8]
    shown = readme.read_text(encoding="utf-8").split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    results = rx.run_all(readme)
    full = [r.stdout.rstrip().splitlines() for r in results]
    assert all(len(lines) > 2 for lines in full)  # the outputs are longer than what is shown
    assert shown == [s.rstrip() for s in full[0][:2] + full[1][:2]]
    assert rx.check(readme) == []


def test_pages_are_the_readme_and_every_docs_page_and_problems_name_their_page():
    pages = rx.pages()
    assert pages[0] == rx.README and rx.DOCS / "cli.md" in pages and rx.DOCS / "planning.md" in pages
    assert all(p.suffix == ".md" for p in pages)
    assert rx.page_name(rx.README) == "README" and rx.page_name(rx.DOCS / "cli.md") == "docs/cli.md"
    exs = rx.examples("```bash\nmemcalc estimate --params 7b --stage 9\n```\n", "docs/cli.md")
    assert [(e.page, e.line) for e in exs] == [("docs/cli.md", 2)]


_DOCS_WITH_EXAMPLES = [p for p in rx.pages()[1:] if rx.examples(p.read_text(encoding="utf-8"), rx.page_name(p))]


@pytest.mark.parametrize("page", _DOCS_WITH_EXAMPLES, ids=lambda p: p.name)
def test_every_docs_page_example_runs_and_shows_what_memcalc_prints(page):
    problems = rx.check(page)
    assert not problems, (
        f"{rx.page_name(page)} is out of date; regenerate with `python docs/readme_examples.py --write`:\n"
        + "\n".join(problems)
    )


def test_a_stderr_marker_shows_what_a_succeeding_command_prints_on_stderr(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- readme: stderr -->\n```bash\n"
        "memcalc estimate --model llama-2-7b --gpus 8 --stage 2 --seq-len 4096 --write-config run\n```\n\n"
        "```text\nx\n```\n",
        encoding="utf-8",
    )
    (ex,) = rx.examples(readme.read_text(encoding="utf-8"))
    assert ex.stderr and not ex.expect_error
    assert rx.write(readme) == [7]
    shown = readme.read_text(encoding="utf-8").split("```text\n", 1)[1].split("\n```", 1)[0]
    assert shown.startswith("memcalc: wrote ds_config.json") and shown.endswith("to run")
    assert rx.check(readme) == []
