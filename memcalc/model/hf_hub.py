"""A Hugging Face Hub id in place of a config.json path: ``--hf-config meta-llama/Llama-3.1-8B``.

The model's config.json is read from the local Hugging Face cache first, the folder ``huggingface_hub`` keeps
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``; inside it ``models--<org>--<name>/refs/<revision>`` names the snapshot and
``snapshots/<commit>/config.json`` holds the file), so a model any transformers script has loaded on this machine is
answered offline. Otherwise config.json alone is fetched (a few KB, no weights) in one HTTPS request to the Hub's
``resolve`` endpoint, as ``huggingface_hub`` builds it (``$HF_ENDPOINT``, default https://huggingface.co; the token
from ``$HF_TOKEN`` or the file ``hf auth login`` writes), with a 10-second timeout and no retries, and nothing is
written; ``HF_HUB_OFFLINE=1`` forbids the request. Every failure is one ``InputError`` line that says what would be
accepted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memcalc.errors import InputError
from memcalc.files import read_bounded

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[A-Za-z0-9._/-]+))?$")
"""``org/name`` or ``org/name@revision`` (a branch, tag or commit): the Hub's own repo-id characters."""

ACCEPTED = ("accepted: the path of a config.json file, or a Hugging Face Hub id (org/name[@revision]) whose "
            "config.json is in the local Hugging Face cache or can be downloaded")


def hub_id(text: str) -> tuple[str, str] | None:
    """(repo id, revision) when ``text`` reads as a Hub id and is not a path that exists; else None."""
    match = HUB_ID.match(text)
    if match is None or match["repo"].endswith((".json", ".toml")) or ".." in match["repo"]:
        return None
    try:
        if Path(text).expanduser().exists():
            return None
    except (OSError, ValueError):
        return None
    return match["repo"], match["rev"] or "main"


def hf_home() -> Path:
    """``huggingface_hub``'s home folder (its constants.py: ``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``), which holds the cache's ``hub`` folder and the login's ``token``."""
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface"


def cache_dir() -> Path:
    """The folder ``huggingface_hub`` caches into: ``$HF_HUB_CACHE`` (or its older name), else ``hf_home()/hub``."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    return hf_home() / "hub"


def cached_config(repo: str, revision: str = "main") -> Path | None:
    """The cached config.json of ``repo`` at ``revision`` (a ref such as main, or a commit), or None."""
    folder = cache_dir() / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
        path = folder / "snapshots" / commit / "config.json"
        return path if path.is_file() else None
    except (OSError, ValueError):
        return None


TIMEOUT_S = 10.0
"""One attempt, bounded: a machine without network answers at once (name resolution fails) or within this."""


def _token() -> str | None:
    """The Hub token as huggingface_hub finds it: ``$HF_TOKEN``, else the file ``hf auth login`` writes."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    path = Path(os.environ.get("HF_TOKEN_PATH", hf_home() / "token")).expanduser()
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, ValueError):
        return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_config(text: str, max_bytes: int, flag: str = "--hf-config") -> tuple[str, bytes]:
    """(where it came from, at most ``max_bytes + 1`` bytes) of the config.json a Hub id names: cached, else fetched;
    one InputError line otherwise."""
    parsed = hub_id(text)
    if parsed is None:
        raise InputError(f"{flag} {text!r} does not exist; {ACCEPTED}")
    repo, revision = parsed
    cached = cached_config(repo, revision)
    if cached is not None:
        return str(cached), read_bounded(cached, flag)[1]
    where = f"{flag} {text!r}"
    if _offline():
        raise InputError(f"{where}: not in the local Hugging Face cache ({cache_dir()}), and HF_HUB_OFFLINE is set; "
                         f"{ACCEPTED}")
    import urllib.error
    import urllib.parse
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/config.json"
    request = urllib.request.Request(url, headers={"User-Agent": "memcalc"})
    token = _token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return url, response.read(max_bytes + 1)
    except urllib.error.HTTPError as e:
        why = {401: "a gated or private model: log in (hf auth login, or HF_TOKEN) and accept its licence on the Hub",
               403: "a gated model whose licence this token has not accepted (accept it on the Hub)",
               404: f"no such model, revision {revision!r} or config.json on the Hub"}.get(e.code, f"HTTP {e.code}")
        raise InputError(f"{where}: {why}; {ACCEPTED}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise InputError(f"{where}: not in the local Hugging Face cache ({cache_dir()}), and the Hub cannot be "
                         f"reached ({' '.join(str(reason).split())[:120]}); {ACCEPTED}") from None
