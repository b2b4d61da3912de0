"""torchtitan 0.3's own parser over memcalc's torchtitan_args.txt files: exit 1 if it refuses any.

Run with the python of a venv that has torchtitan 0.3 (not memcalc's: their dependencies clash):

    python tests/frameworks/check_torchtitan_args.py DIR/torchtitan_args.txt ...

Each file's words (``#`` lines dropped, as launch.sh's ``grep -v '^#'``) go to ``ConfigManager().parse_args``, which
loads the registered config named by ``--module``/``--config`` and refuses an unknown option or a value it cannot
take. Two stand-ins make this run on a machine without a GPU: ``llama3_405b`` builds float8 linears, which torchtitan
allows only on an SM89+ GPU, so the capability check answers yes; and its HF assets folder need not exist (a warning).
"""

from __future__ import annotations

import shlex
import sys


def main(paths: list[str]) -> int:
    import torchtitan.components.quantization.float8 as float8

    float8.has_cuda_capability = lambda *_: True  # parse only: no float8 kernel runs here
    from torchtitan.config.manager import ConfigManager

    if not paths:
        print("give torchtitan_args.txt files", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            words = shlex.split(f.read(), comments=True)
        try:
            cfg = ConfigManager().parse_args(words)
        except (Exception, SystemExit) as e:  # tyro exits on a refused option after printing why
            print(f"FAIL {path}: torchtitan refused {' '.join(words)}: {type(e).__name__} {e}", file=sys.stderr)
            failed += 1
            continue
        p, t, c = cfg.parallelism, cfg.training, cfg.compile
        ac = type(cfg.activation_checkpoint).__qualname__.split(".")[0] if cfg.activation_checkpoint else "none"
        print(f"ok {path}: dp_replicate {p.data_parallel_replicate_degree} dp_shard {p.data_parallel_shard_degree} "
              f"tp {p.tensor_parallel_degree} pp {p.pipeline_parallel_degree} cp {p.context_parallel_degree}, local "
              f"batch {t.local_batch_size} global {t.global_batch_size} seq {t.seq_len}, AC {ac}, compile {c.enable}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
