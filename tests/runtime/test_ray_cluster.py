"""Ray clusters: a run starts and stops its own local Ray, or joins one started with `ray start`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from ray_helpers import REPO, work_tree_temp
from team_helpers import dyad_config

from mas.cli import main
from mas.config.schema import validate_config
from mas.runtime.ray_cluster import ray_temp_dir
from mas.training.team import build_team
from mas.training.trainer import train


def ray_processes(temp: Path) -> list[psutil.Process]:
    """Processes of the Ray instance whose temp dir is ``temp`` (its path is on their command line)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(temp) in arg for arg in p.info["cmdline"] or ()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def test_quickstart_under_ray_starts_and_stops_its_own_ray_in_the_run_dir(tmp_path, capsys):
    """`mas train configs/quickstart.yaml runtime.kind=ray` (shortened): the same progress and
    summary as local; Ray's temp dir is RUN_DIR/ray, and nothing of that Ray is left running."""
    import ray

    run = work_tree_temp("run")  # inside the work tree, short enough for Ray's socket paths
    try:
        args = ["train", str(REPO / "configs" / "quickstart.yaml"), "runtime.kind=ray", "trainer.steps=2",
                "trainer.eval_size=20", "--run-dir", str(run)]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "held-out team accuracy: before" in out and f"run directory: {run}" in out
        assert not ray.is_initialized()
        sessions = list((run / "ray").glob("session_2*"))
        assert sessions and (sessions[0] / "logs").is_dir()
        assert ray_processes(run / "ray") == []
        info = json.loads((run / "run_info.json").read_text())
        assert info["runtime"] == "ray" and {p["actor"]["pid"] for p in info["policies"].values()} - {os.getpid()}
        assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line] == [0, 1]
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_a_long_run_dir_gets_a_short_ray_temp_dir_linked_from_it(tmp_path):
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    temp = ray_temp_dir(deep)
    assert len(str(temp)) + 72 <= 107 and (deep / "ray").resolve() == temp.resolve()
    shutil.rmtree(temp)


# ---------------------------------------------------------------------------------------------
# two nodes on this machine
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(temp: Path, resources: dict, head_port: int, head: bool) -> subprocess.Popen:
    """`ray start --block` with every port free-picked (other people's Ray may be running here)."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    cmd = [ray_bin, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--disable-usage-stats",
           f"--resources={json.dumps(resources)}", "--object-store-memory=100000000", f"--temp-dir={temp}",
           f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
           "--min-worker-port=0", "--max-worker-port=0", f"--metrics-export-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
           f"--runtime-env-agent-port={free_port()}"]
    if head:
        cmd += ["--head", f"--port={head_port}", "--include-dashboard=false", f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}"]
    else:
        cmd += [f"--address=127.0.0.1:{head_port}"]
    log = open(temp.parent / f"{'head' if head else 'worker'}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def stop_node(proc: subprocess.Popen, temp: Path) -> None:
    """Stop one node: SIGTERM to its `ray start --block` (which stops its processes), then kill
    by pid whatever of this node is still running."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    deadline = time.time() + 20
    while ray_processes(temp) and time.time() < deadline:
        time.sleep(0.5)
    for p in ray_processes(temp):
        p.kill()


def connect(address: str, timeout: float = 120) -> None:
    """``ray.init(address)`` once the head node answers."""
    import ray

    deadline = time.time() + timeout
    while True:
        try:
            ray.init(address=address, logging_level="WARNING")
            return
        except ConnectionError:
            if time.time() > deadline:
                raise
            time.sleep(1)


def test_two_nodes_each_policy_pinned_by_a_custom_resource(tiny_model_dir, tmp_path):
    """A head and a second node (two `ray start` processes on 127.0.0.1, custom resources node_a
    and node_b); `resources.custom` pins one policy to each; 2 steps train; each actor ran on its
    node."""
    import ray

    base = work_tree_temp("nodes")
    temps = {name: ray_temp_dir(base / name) for name in ("head", "worker")}
    port = free_port()
    nodes = {"head": start_node(temps["head"], {"node_a": 1}, port, head=True)}
    try:
        connect(f"127.0.0.1:{port}")
        nodes["worker"] = start_node(temps["worker"], {"node_b": 1}, port, head=False)
        deadline = time.time() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.time() < deadline, "the second node did not join"
            time.sleep(0.5)
        node_of = {res: n["NodeID"] for n in ray.nodes() if n["Alive"] for res in ("node_a", "node_b") if res in n["Resources"]}

        cfg = dyad_config(tiny_model_dir, {"method": "grpo"}, steps=2)
        cfg["policies"]["think"]["resources"] = {"custom": {"node_a": 0.5}}
        cfg["policies"]["solve"]["resources"] = {"custom": {"node_b": 0.5}}
        cfg["runtime"] = {"kind": "ray", "address": f"127.0.0.1:{port}", "num_threads": 1}
        with build_team(validate_config(cfg)) as team:
            where = team.runtime.describe()
            train(team, tmp_path / "run")
        assert where["think"]["actor"]["node_id"] == node_of["node_a"]
        assert where["solve"]["actor"]["node_id"] == node_of["node_b"]
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1] and all(r["policies"]["solve"]["samples"] > 0 for r in rows)
        # the actor on the other node sent its checkpoint files back through Ray
        assert (tmp_path / "run" / "checkpoints" / "step_000001" / "policies" / "solve" / "model.safetensors").is_file()
    finally:
        ray.shutdown()
        for name, proc in reversed(list(nodes.items())):
            stop_node(proc, temps[name])
        leftovers = [p.pid for t in temps.values() for p in ray_processes(t)]
        shutil.rmtree(base, ignore_errors=True)
        for t in temps.values():
            shutil.rmtree(t, ignore_errors=True)
    assert leftovers == []
