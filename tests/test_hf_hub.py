"""--hf-config with a Hugging Face Hub id: the local cache's config.json, else one request to the Hub's resolve
endpoint (served here by a local HTTP server through HF_ENDPOINT: no network), and one line for every failure."""

import http.server
import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memcalc
from memcalc.cli import app
from memcalc.errors import InputError
from memcalc.model.hf_config import load_hf_config, read_config
from memcalc.model.hf_hub import cache_dir, hub_id

LLAMA1B = Path(__file__).resolve().parent / "data" / "h100" / "llama-3.2-1b" / "config.json"
runner = CliRunner()


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """An empty cache and no token, whatever this machine has."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_TOKEN", "HF_TOKEN_PATH",
                 "HF_HUB_OFFLINE", "HF_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def _cache(root: Path, repo: str, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / commit).mkdir(parents=True)
    for ref in refs:
        (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    path = folder / "snapshots" / commit / "config.json"
    path.write_bytes(LLAMA1B.read_bytes())
    return path


def test_hub_ids_and_paths_are_told_apart(tmp_path):
    assert hub_id("meta-llama/Llama-3.2-1B") == ("meta-llama/Llama-3.2-1B", "main")
    assert hub_id("Qwen/Qwen3-8B@refs/pr/3") == ("Qwen/Qwen3-8B", "refs/pr/3")
    for path in ("config.json", "./a/b", "a/b/c", "a/config.json", "/abs/x", "~/x/y", "a/../b", "a b/c"):
        assert hub_id(path) is None, path
    folder = tmp_path / "org" / "name"
    folder.mkdir(parents=True)
    assert hub_id(str(folder.relative_to(tmp_path))) is not None  # relative to the test's cwd, which is not tmp_path
    assert hub_id(str(folder)) is None  # an existing path stays a path


def test_cache_folder_follows_huggingface_hub(monkeypatch, hub_env, tmp_path):
    assert cache_dir() == hub_env / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"


def test_a_cached_model_is_read_offline(monkeypatch, hub_env):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache(hub_env / "hub", "meta-llama/Llama-3.2-1B", "c0ffee", refs=("main", "v1"))
    arch = load_hf_config("meta-llama/Llama-3.2-1B")
    assert arch == load_hf_config(str(LLAMA1B)).model_copy(update={"name": arch.name})
    assert arch.name == "meta-llama/Llama-3.2-1B"
    assert load_hf_config("meta-llama/Llama-3.2-1B@v1") == arch
    assert load_hf_config("meta-llama/Llama-3.2-1B@c0ffee") == arch  # a commit, as the snapshot's folder
    with pytest.raises(InputError, match=r"^--hf-config 'meta-llama/Llama-3.2-1B@v2': not in the local Hugging Face "
                                         r"cache \(.*\), and HF_HUB_OFFLINE is set; accepted: the path of a "
                                         r"config.json file, or a Hugging Face Hub id"):  # fmt: skip
        load_hf_config("meta-llama/Llama-3.2-1B@v2")
    r = memcalc.estimate(hf_config="meta-llama/Llama-3.2-1B", gpus=8, fsdp="FULL_SHARD", fsdp_version=2,
                         seq_len=2048, micro_batch=1, precision="bf16-mixed")  # fmt: skip
    assert r.accounting == "realistic" and r.memory.per_gpu.total > 0


class _Hub(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        _Hub.seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/org/tiny/resolve/main/config.json":
            body = LLAMA1B.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(401 if self.path.startswith("/gated/") else 404)
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def local_hub(monkeypatch, hub_env):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}/")
    _Hub.seen = []
    yield _Hub.seen
    server.shutdown()


def test_an_uncached_model_is_fetched_in_one_request(monkeypatch, local_hub, hub_env):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    data = read_config("org/tiny")
    assert json.loads(data) == json.loads(LLAMA1B.read_bytes())
    assert local_hub == [("/org/tiny/resolve/main/config.json", "Bearer hf_secret")]
    assert not (hub_env / "hub").exists()  # nothing is written
    with pytest.raises(InputError, match=r"^--hf-config 'gated/model': a gated or private model: log in"):
        read_config("gated/model")
    with pytest.raises(InputError, match=r"^--hf-config 'org/tiny@v9': no such model, revision 'v9' or config.json"):
        read_config("org/tiny@v9")
    assert len(local_hub) == 3  # one request each, no retries
    monkeypatch.delenv("HF_TOKEN")
    (hub_env / "token").parent.mkdir(parents=True, exist_ok=True)
    (hub_env / "token").write_text("hf_from_login\n")
    read_config("org/tiny")
    assert local_hub[-1][1] == "Bearer hf_from_login"


def test_an_unreachable_hub_is_one_line_and_exit_2(monkeypatch, hub_env):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    out = runner.invoke(app, ["estimate", "--hf-config", "org/tiny", "--gpus", "8", "--seq-len", "512"])
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and "'org/tiny': not in the local Hugging Face cache" in lines[0]
    assert "the Hub cannot be reached" in lines[0]


def test_a_hub_id_given_as_a_preset_says_where_it_goes():
    out = runner.invoke(app, ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8"])
    assert out.exit_code == 2
    assert out.output.strip().endswith("for a Hugging Face model give --hf-config meta-llama/Llama-3.1-8B (a Hub id "
                                       "or a config.json path)")  # fmt: skip
