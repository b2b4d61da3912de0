"""The frameworks' own config files in: DeepSpeed JSON, accelerate YAML, torchtitan TOML.

Each reader returns a ``ConfigReading`` whose ``arguments`` go straight into ``memcalc.estimate``:

    >>> import memcalc
    >>> from memcalc.configs import read_deepspeed
    >>> r = read_deepspeed("ds_config.json", world_size=8, micro_batch=4, seq_len=4096)
    >>> memcalc.estimate(**r.arguments, model="llama-2-7b")

``merge_arguments(reading.arguments, flags_the_user_typed)`` lets explicit flags win over the file.
``read`` lists the keys used, ``ignored`` the keys that do not change memory (with why), ``unmodelled`` the
memory-relevant settings memcalc does not model yet, ``notes`` how ``"auto"`` and defaults were resolved.
"""

from __future__ import annotations

from memcalc.configs.accelerate import read_accelerate
from memcalc.configs.deepspeed import read_deepspeed
from memcalc.configs.reading import ConfigReading, merge_arguments
from memcalc.configs.torchtitan import read_torchtitan

__all__ = ["ConfigReading", "merge_arguments", "read_accelerate", "read_deepspeed", "read_torchtitan"]
