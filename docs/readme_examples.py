"""Run the examples of README.md and of every docs/*.md page with this checkout's memcalc; check, or rewrite, the
output shown under them.

    python docs/readme_examples.py --check     # exit 1 naming, per example, the first line that differs
    python docs/readme_examples.py --write     # regenerate the shown outputs in README.md and docs/*.md
    python docs/readme_examples.py --check --readme docs/cli.md    # one page (the option repeats)

What runs:
- in a ```bash block, every line that starts with ``memcalc`` (``\\`` continuations joined, ``#`` comments
  dropped). A ```text block right after the bash block (blank lines between allowed) is the output shown: the
  outputs of the block's commands, in order.
- in a ```console block, every ``$ memcalc ...`` line that is followed by output lines: the transcript shows what
  the command prints. A ``$ memcalc`` line with no output under it is an illustration and is not run.
- a ```python block marked ``<!-- readme: run -->``: run as a script. A one-line expression whose comment starts
  with a literal (``r.memory.fit.fits  # True``, ``r.memory.per_gpu.total  # 22_411_870_912 bytes``) must
  equal it. A ```text block right after it is its stdout.

Markers, an HTML comment on the line before a block: ``<!-- readme: error -->`` (its commands show a mistake:
exit 2, nothing on stdout, one line on stderr; that line is the output shown), ``<!-- readme: skip -->`` (not
run), ``<!-- readme: run -->`` (a runnable python block), ``<!-- readme: file NAME -->`` (the block is a file the
commands read, written as NAME into their directory first: a ds_config.json, a config.json), ``<!-- readme: head N
-->`` (on a bash or console block: the output shown is the first N lines of each command's output; the commands
still run whole and must succeed), ``<!-- readme: stderr -->`` (the output shown is what the commands print on
stderr, for commands whose stdout is shown elsewhere: ``--write-config``'s files written, a config file's notes; they
must exit 0). A console transcript whose output starts with ``memcalc: error:`` is an error
example too.

Each page runs in a directory of its own, so a command can read what an earlier command of the same page wrote
(``--write-config run`` then ``--torchtitan-config run/torchtitan.toml``).

Commands run as ``python -m memcalc`` with this checkout first on PYTHONPATH, in a fresh temporary directory that
links to the checkout's top-level entries (so ``tests/data/...`` paths resolve; what commands write stays there),
with a fixed environment (COLUMNS=160, C.UTF-8, no colour, UTC) so that rich lays tables out the same on every
machine. Compared and written outputs drop trailing spaces on each line and trailing blank lines.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
WIDTH = 160
TIMEOUT_S = 120

_FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*readme:\s*(run|error|skip|stderr|head\s+[1-9]\d*|file\s+[\w.-][\w./-]*)\s*-->\s*$")
_SHELL_SYNTAX = {"|", "||", "&&", ";", ">", ">>", "<", "&", "2>", "2>&1"}

# Runs a python example statement by statement; a one-line expression commented with a literal must equal it.
_DRIVER = r"""
import ast, io, re, sys, tokenize
path = sys.argv[1]
src = open(path, encoding="utf-8").read()
comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
            if t.type == tokenize.COMMENT}
literal = re.compile(r"#\s*(True|False|None|[-+]?\d[\d_]*(?:\.\d[\d_]*)?(?:e[-+]?\d+)?)(?![\w.])")
ns = {"__name__": "__main__"}
for node in ast.parse(src, path).body:
    m = literal.match(comments.get(node.end_lineno, "")) if isinstance(node, ast.Expr) else None
    if m is None or node.lineno != node.end_lineno:
        exec(compile(ast.Module([node], []), path, "exec"), ns)
        continue
    got = eval(compile(ast.Expression(node.value), path, "eval"), ns)
    want = ast.literal_eval(m.group(1))
    if got != want or isinstance(got, bool) != isinstance(want, bool):
        sys.stderr.write(f"line {node.lineno}: {ast.unparse(node.value)} is {got!r}; the page says {want!r}\n")
        sys.exit(1)
"""


@dataclass(frozen=True)
class Block:
    """A fenced block: its language, the lines of its fences (0-based) and the marker above it, if any."""

    lang: str
    open: int
    close: int
    marker: str | None

    def body(self, lines: list[str]) -> list[str]:
        return lines[self.open + 1 : self.close]


@dataclass(frozen=True)
class Example:
    """One command (or python block) of a page and where its shown output lies."""

    kind: str
    """``shell`` or ``python``."""
    line: int
    """1-based line of the command (of the fence, for python) in its page."""
    source: str
    expect_error: bool = False
    output: tuple[int, int] | None = None
    """Lines [start, end) (0-based) of the output shown, shared by the commands of one bash block."""
    group: tuple[int, ...] = ()
    """Indices (in the example list) of the commands whose outputs, concatenated, fill ``output``."""
    head: int | None = None
    """``<!-- readme: head N -->``: only the first N lines of each command's output are shown."""
    stderr: bool = False
    """``<!-- readme: stderr -->``: the output shown is stderr, of a command that succeeds."""
    page: str = "README"
    """Where the example is, as problems name it: ``README`` or the page's path (``docs/cli.md``)."""


@dataclass
class Result:
    example: Example
    returncode: int
    stdout: str
    stderr: str
    problems: list[str] = field(default_factory=list)

    @property
    def shown_output(self) -> str:
        """What the page should show for this example: stderr for an error example or under a stderr marker, else
        stdout (its first ``head`` lines under a head marker)."""
        ex = self.example
        text = normalize(self.stderr if ex.expect_error or ex.stderr else self.stdout)
        return text if ex.head is None else "\n".join(text.splitlines()[: ex.head])


def normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


_WALL = re.compile(r"searched in [\d,.]+ s, [\d,]+ candidates/s")


def steady(text: str) -> str:
    """``memcalc plan``'s wall time, which no two runs share, masked for the comparison (its line stays shown)."""
    return _WALL.sub("searched in (wall time)", text)


def page_name(path: Path) -> str:
    """How problems name a page: ``README`` for README.md, else its path from the repository (``docs/cli.md``)."""
    path = path.resolve()
    if path.name == "README.md" and path.parent != DOCS:
        return "README"
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, the pages whose examples are checked."""
    return [README, *sorted(DOCS.glob("*.md"))]


def blocks(lines: list[str], page: str = "README") -> list[Block]:
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if close is None:
            raise ValueError(f"{page} line {i + 1}: a ``` block that never closes")
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(above)
        found.append(Block(m.group(1).lower(), i, close, marker.group(1) if marker else None))
        i = close + 1
    return found


def _joined(body: list[str], first: int) -> list[tuple[int, str, int]]:
    """(first line, logical line, last line) with backslash continuations joined; lines are 0-based."""
    out, i = [], 0
    while i < len(body):
        start, text = i, body[i].rstrip()
        while text.endswith("\\") and i + 1 < len(body):
            i += 1
            text = text[:-1] + " " + body[i].strip()
        out.append((first + start, text, first + i))
        i += 1
    return out


def _is_memcalc(command: str) -> bool:
    return command == "memcalc" or command.startswith("memcalc ")


def _next_text_block(bs: list[Block], k: int, lines: list[str]) -> Block | None:
    if k + 1 >= len(bs) or bs[k + 1].lang != "text":
        return None
    nxt = bs[k + 1]
    between = lines[bs[k].close + 1 : nxt.open]
    return nxt if all(not s.strip() for s in between) else None


def files(text: str, page: str = "README") -> dict[str, str]:
    """The blocks marked ``<!-- readme: file NAME -->``: NAME -> contents."""
    lines = text.splitlines()
    found = {}
    for b in blocks(lines, page):
        if b.marker is not None and b.marker.startswith("file"):
            name = b.marker.split(None, 1)[1]
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"{page} line {b.open}: a file example must be a relative path inside the directory, not {name!r}")
            found[name] = "\n".join(b.body(lines)) + "\n"
    return found


def examples(text: str, page: str = "README") -> list[Example]:
    """Every example a page's text holds, in order."""
    lines = text.splitlines()
    bs = blocks(lines, page)
    found: list[Example] = []
    for k, b in enumerate(bs):
        if b.marker == "skip":
            continue
        error = b.marker == "error"
        head = int(b.marker.split()[1]) if b.marker is not None and b.marker.startswith("head") else None
        stderr = b.marker == "stderr"
        if b.lang in ("bash", "sh", "shell"):
            shown = _next_text_block(bs, k, lines)
            out = (shown.open + 1, shown.close) if shown else None
            cmds = [(ln, t.strip()) for ln, t, _ in _joined(b.body(lines), b.open + 1) if _is_memcalc(t.strip())]
            group = tuple(range(len(found), len(found) + len(cmds)))
            for ln, t in cmds:
                found.append(Example("shell", ln + 1, t, error, out, group if out else (), head, stderr, page))
        elif b.lang == "console":
            body = _joined(b.body(lines), b.open + 1)
            for n, (ln, t, last) in enumerate(body):
                if not t.startswith("$ ") or not _is_memcalc(t[2:].strip()):
                    continue
                end = next((s for s, u, _ in body[n + 1 :] if u.startswith("$ ")), b.close)
                if end == last + 1 or not any(s.strip() for s in lines[last + 1 : end]):
                    continue  # an illustration: no output shown under it
                shown_error = lines[last + 1].startswith("memcalc: error:")
                found.append(Example("shell", ln + 1, t[2:].strip(), error or shown_error, (last + 1, end),
                                     (len(found),), head, stderr, page))  # fmt: skip
        elif b.lang in ("python", "py") and b.marker == "run":
            shown = _next_text_block(bs, k, lines)
            out = (shown.open + 1, shown.close) if shown else None
            found.append(Example("python", b.open + 1, "\n".join(b.body(lines)), error, out,
                                 (len(found),) if out else (), None, False, page))  # fmt: skip
    return found


def environment(workdir: Path) -> dict[str, str]:
    """A fixed environment: nothing from the caller's terminal, locale or colour settings leaks in."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "PYTHONPATH": str(ROOT),
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "COLUMNS": str(WIDTH),
        "LINES": "50",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }


def prepare(workdir: Path, contents: dict[str, str]) -> None:
    """Fills ``workdir``: links to the checkout's top-level folders and files (the pages' paths such as
    ``tests/data/...`` are relative to the repository), then the page's file blocks."""
    own = {name.split("/")[0] for name in contents}  # never written through a link into the checkout
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in own:
            (workdir / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for name, body in contents.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")


def run(example: Example, workdir: Path) -> Result:
    """Runs one example in ``workdir`` with this checkout's memcalc."""
    if example.kind == "python":
        script = workdir / f"readme_line_{example.line}.py"
        script.write_text(example.source + "\n", encoding="utf-8")
        argv = [sys.executable, "-c", _DRIVER, str(script)]
    else:
        words = shlex.split(example.source, comments=True)
        odd = [w for w in words if w in _SHELL_SYNTAX]
        if odd:
            return Result(example, -1, "", "", [f"{example.page} line {example.line}: only plain memcalc commands run "
                                                 f"here, not shell syntax {odd[0]!r}: {example.source}"])  # fmt: skip
        argv = [sys.executable, "-m", "memcalc", *words[1:]]
    proc = subprocess.run(argv, cwd=workdir, env=environment(workdir), capture_output=True, text=True,
                          encoding="utf-8", timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    res = Result(example, proc.returncode, proc.stdout, proc.stderr)
    res.problems += _exit_problems(res)
    return res


def _exit_problems(res: Result) -> list[str]:
    ex = res.example
    shown = shlex.join(shlex.split(ex.source, comments=True)) if ex.kind == "shell" else "the python block"
    where = f"{ex.page} line {ex.line}: {shown}"
    if ex.expect_error:
        err = res.stderr.rstrip("\n")
        bad = []
        if res.returncode != 2:
            bad.append(f"exits {res.returncode}, not 2")
        if not err or "\n" in err:
            bad.append(f"stderr has {len(err.splitlines())} lines, not one")
        if res.stdout.strip():
            bad.append("prints on stdout")
        return [f"{where}: an error example that {', '.join(bad)}\n{_tail(res.stderr)}"] if bad else []
    if res.returncode != 0:
        return [f"{where}: exits {res.returncode}\n{_tail(res.stderr)}"]
    return []


def _tail(text: str, n: int = 8) -> str:
    return "\n".join("    " + s for s in text.rstrip().splitlines()[-n:])


def first_difference(shown: str, actual: str) -> tuple[int, str, str] | None:
    """(0-based line, shown line, actual line) of the first difference, or None when equal."""
    a, b = shown.splitlines(), actual.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "<end of the shown output>"
        y = b[i] if i < len(b) else "<end of the output>"
        if x != y:
            return i, x, y
    return None


def run_all(readme: Path = README) -> list[Result]:
    """Runs every example of the page ``readme`` and compares each shown output block with the real output."""
    text = readme.read_text(encoding="utf-8")
    lines = text.splitlines()
    page = page_name(readme)
    exs = examples(text, page)
    with tempfile.TemporaryDirectory(prefix="memcalc-readme-") as tmp:
        prepare(Path(tmp), files(text, page))
        results = [run(ex, Path(tmp)) for ex in exs]
    for n, res in enumerate(results):
        ex = res.example
        if ex.output is None or not ex.group or ex.group[-1] != n:
            continue  # compared once per output block, by its last command
        start, end = ex.output
        shown = normalize("\n".join(lines[start:end]))
        diff = first_difference(steady(shown), steady(expected_output(results, ex)))
        if diff is not None:
            i, x, y = diff
            res.problems.append(f"{page} line {start + i + 1} (output of line {ex.line}) differs:\n"
                                f"    {page}: {x}\n    actual: {y}")  # fmt: skip
    return results


def expected_output(results: list[Result], ex: Example) -> str:
    return "\n".join(results[i].shown_output for i in ex.group)


def check(readme: Path = README) -> list[str]:
    """Every problem found: failed commands, error examples that do not fail as shown, stale outputs."""
    return [p for r in run_all(readme) for p in r.problems]


def write(readme: Path = README) -> list[int]:
    """Rewrites the stale output blocks of ``readme``; returns the 1-based lines of the blocks rewritten."""
    text = readme.read_text(encoding="utf-8")
    lines = text.splitlines()
    results = run_all(readme)
    failed = [p for r in results for p in r.problems if "differs:" not in p]
    if failed:
        raise SystemExit("not written; these examples fail:\n" + "\n".join(failed))
    regions = {}
    for n, r in enumerate(results):
        ex = r.example
        if ex.output is not None and ex.group and ex.group[-1] == n:
            regions[ex.output] = expected_output(results, ex)
    rewritten = []
    for (start, end), out in sorted(regions.items(), reverse=True):
        if steady(normalize("\n".join(lines[start:end]))) != steady(out):
            lines[start:end] = out.splitlines() if out else []
            rewritten.append(start + 1)
    if rewritten:
        readme.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""), encoding="utf-8")
    return sorted(rewritten)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare shown outputs with real ones; exit 1 on a difference")
    mode.add_argument("--write", action="store_true", help="regenerate the shown outputs in place")
    p.add_argument("--readme", type=Path, action="append",
                   help="a Markdown page (repeatable; default: README.md and every docs/*.md page)")  # fmt: skip
    args = p.parse_args(argv)
    paths = args.readme or pages()
    if args.write:
        for path in paths:
            done = write(path)
            print(f"{page_name(path)}: rewrote {len(done)} output block(s)"
                  + (f" at lines {', '.join(map(str, done))}" if done else ""))  # fmt: skip
        return 0
    problems, n = [], 0
    for path in paths:
        problems += check(path)
        n += len(examples(path.read_text(encoding="utf-8"), page_name(path)))
    for prob in problems:
        print(prob, file=sys.stderr)
    print(f"{n} examples in {len(paths)} page(s), {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
