"""A hub model id without network fails in seconds, saying what to do; a cached one loads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hub_stub import FakeHub, closed_port  # noqa: F401 (a fixture)
from team_helpers import team_config

from mas import hub
from mas.cli import main

HUB_ID = "mas-test/tiny-model"


def no_network_env(tmp_path: Path, port: int) -> dict:
    """The hub endpoint is a local port that refuses connections; offline mode is off."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf-home"), PYTHONUNBUFFERED="1")
    return env


def hub_config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = team_config(model_dir, "chain")
    cfg["policies"]["main"]["model"] = HUB_ID
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_with_an_unreachable_hub_fails_at_once_with_what_to_do(tmp_path, tiny_model_dir, closed_port):
    done = subprocess.run([sys.executable, "-m", "mas.cli", "train", str(hub_config(tmp_path, tiny_model_dir)),
                           "--run-dir", str(tmp_path / "run")], env=no_network_env(tmp_path, closed_port),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    err = done.stderr
    assert f"policy 'main': model '{HUB_ID}'" in err and "cannot be reached" in err and "not in the local cache" in err
    assert "HF_HUB_OFFLINE=1" in err and "local path" in err
    assert "Retrying" not in err and "Traceback" not in err  # one try, no back-off


def test_offline_mode_names_the_model_before_anything_loads(tmp_path, tiny_model_dir, capsys):
    # the test command runs with HF_HUB_OFFLINE=1
    assert main(["train", str(hub_config(tmp_path, tiny_model_dir)), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"policies.main.model: not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in err
    assert f"hf download {HUB_ID}" in err and not (tmp_path / "run").exists()


def put_in_hub_cache(hf_home: Path, repo: str, model_dir: Path) -> None:
    """Lay ``model_dir`` out as huggingface_hub's cache does (refs/main -> snapshots/<commit>/)."""
    commit = "0" * 40
    repo_dir = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(model_dir, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)


def test_a_cached_hub_model_loads_from_the_cache_when_the_hub_is_unreachable(tmp_path, tiny_model_dir, closed_port):
    env = no_network_env(tmp_path, closed_port)
    put_in_hub_cache(Path(env["HF_HOME"]), HUB_ID, tiny_model_dir)
    code = ("from mas.agents.policy import load_model_and_tokenizer as load\n"
            f"model, tok = load({HUB_ID!r}, 'float32', 'cpu', False)\n"
            "print('loaded', sum(p.numel() for p in model.parameters()))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("loaded ") and "Retrying" not in done.stderr


def test_an_unreachable_hub_is_asked_again_after_a_while_and_an_answer_is_kept_longer(monkeypatch):
    """A notebook or a long study sees the network come back; a run loading many policies asks once."""
    from huggingface_hub import constants

    now = [1000.0]
    monkeypatch.setattr(hub._unreachable, "clock", lambda: now[0], raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused, as with no network
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{sock.getsockname()[1]}")
    with pytest.raises(hub.HubUnreachable, match="cannot be reached"):
        hub.require_hub("upload")
    with FakeHub(sock) as fake:  # the network is back, on the same address
        now[0] += hub.FAILURE_TTL_S - 1
        with pytest.raises(hub.HubUnreachable):  # the failure is still believed: nothing is asked
            hub.require_hub("upload")
        assert fake.requests == []
        now[0] += 2
        hub.require_hub("upload")  # asked again: it answers
        now[0] += 2 * hub.FAILURE_TTL_S
        hub.require_hub("upload")  # an answer is kept longer than a failure
        assert [method for method, _, _ in fake.requests] == ["HEAD"]
    now[0] += hub.SUCCESS_TTL_S
    with pytest.raises(hub.HubUnreachable, match="cannot be reached"):  # gone again, and asked again
        hub.require_hub("upload")
