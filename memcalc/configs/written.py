"""What one framework's writer returns (``memcalc.configs.write_frameworks``, ``write_parallel``), before
``memcalc.configs.writing`` checks it by reading it back."""

from __future__ import annotations

import dataclasses
from typing import Any

from memcalc.frozen import frozen

@frozen
class Written:
    """One framework's files for one estimate, with the flags that read them back."""

    framework: str
    files: dict[str, str]
    """File name -> text (the framework's files; ``launch.sh`` and ``README.txt`` are added by ``config_text``)."""
    read_back: tuple[tuple[str, str], ...]
    """(memcalc's reader flag, the file it reads), each checked (DeepSpeed's JSON alone and through accelerate)."""
    flags: dict[str, Any]
    """memcalc.estimate arguments the files do not hold (the training script's, or the world size)."""
    launch: str
    """The launch line(s) of ``launch.sh``."""
    fill_in: list[str]
    """What the user must add before running."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the files assume that is worth saying."""
