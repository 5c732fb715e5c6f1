"""Starting, joining and leaving the Ray cluster of one run (``runtime.address``).

    address: null          start a local Ray instance for this run: its temp dir is ``RUN_DIR/ray``
                           (logs of every actor), its CPUs are at least what the policies ask for
                           (logical CPUs: a laptop runs a 3-policy team on 2 cores), no dashboard,
                           every port picked free (two runs on one machine do not collide);
                           it is shut down when the run ends, however it ends
    address: auto          join the cluster that ``ray start`` started on this machine
    address: host:port     join the cluster whose head listens there
    address: ray://h:10001 join through Ray Client (the driver is not on a cluster node)

If this process is already connected to Ray (``ray.init()`` in a notebook or a test), the run
uses that connection and leaves it open.  Environment variables the actors need (offline
flags, caches, MKL's reproducibility switch) are forwarded to every worker of the job.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

# forwarded to the workers of the job (a cluster's workers do not inherit the driver's environment)
FORWARDED_ENV = (
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
    "MAS_CACHE_DIR", "MKL_CBWR", "TOKENIZERS_PARALLELISM", "CUBLAS_WORKSPACE_CONFIG", "THP_MEM_ALLOC_ENABLE",
)
# an AF_UNIX socket path holds at most 107 bytes; Ray puts its sockets at
# <temp>/session_<date>_<time>_<pid>/sockets/plasma_store (about 70 bytes under <temp>)
_SOCKET_ROOM = 72


def import_ray():
    try:
        import ray
    except ImportError:
        from mas.errors import MissingDependencyError

        raise MissingDependencyError(
            "runtime.kind: ray needs Ray: pip install 'mas-rl[ray]' (or EXTRAS=dev,ray bash scripts/setup.sh)"
        ) from None
    return ray


def start_local_ray(ray: Any, **init_kwargs: Any) -> Any:
    """``ray.init(**init_kwargs)`` starting a new local instance whose dashboard agent listens
    on a port the OS picks, like every other port of a local instance.

    Left alone, Ray gives the agent's HTTP server the fixed port 52365, so the second Ray on a
    machine (two runs, a run beside a test suite or a notebook's Ray) finds it taken: its agent
    retries for about 3 s, then runs without its HTTP service (the job and state APIs' way in),
    with only a traceback in dashboard_agent.log to say so.  ``ray.init`` takes no argument for
    that port (``ray start --dashboard-agent-listen-port`` does; Ray's maintainers point there,
    ray-project/ray#34886), so while this call runs, the node parameters ``ray.init`` builds
    default to port 0, "any free port", which the agent supports.  A Ray whose parameters lack
    that field is started as is.
    """
    from ray._private import parameter

    params = parameter.RayParams
    if "dashboard_agent_listen_port" not in inspect.signature(params.__init__).parameters:
        return ray.init(**init_kwargs)

    class FreeAgentPort(params):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("dashboard_agent_listen_port", 0)
            super().__init__(*args, **kwargs)

    parameter.RayParams = FreeAgentPort
    try:
        return ray.init(**init_kwargs)
    finally:
        parameter.RayParams = params


def ray_temp_dir(run_dir: Path) -> Path:
    """``RUN_DIR/ray``, or, when that path is too long for Ray's sockets, a short temp dir that
    ``RUN_DIR/ray`` links to (so the actors' logs are still found from the run directory)."""
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    wanted = run_dir / "ray"
    if len(str(wanted)) + _SOCKET_ROOM <= 107:
        return wanted
    short = Path(tempfile.mkdtemp(prefix="mas-ray-"))
    if wanted.is_symlink() or not wanted.exists():
        wanted.unlink(missing_ok=True)
        wanted.symlink_to(short, target_is_directory=True)
    return short


class RaySession:
    """This run's connection to Ray: ``close()`` shuts down what it started and leaves what it joined."""

    def __init__(self, address: str | None, run_dir: Path | None, num_cpus: float):
        ray = import_ray()
        self.ray = ray
        self.started = False  # a local instance of our own: shut it down at the end
        self.connected = False  # we called ray.init: disconnect at the end
        self.client = bool(address and address.startswith("ray://"))
        self.temp: Path | None = None  # Ray's directory for a local instance of ours
        self.run_link: Path | None = None  # RUN_DIR/ray, a link to ``temp`` when that is a short temp dir
        if ray.is_initialized():
            return
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        kwargs = dict(include_dashboard=False, runtime_env={"env_vars": env} if env else None,
                      logging_level="WARNING", log_to_driver=True)
        if address is None:
            temp = self.temp = ray_temp_dir(run_dir) if run_dir is not None else None
            self.run_link = Path(run_dir).resolve() / "ray" if run_dir is not None else None
            start_local_ray(ray, num_cpus=max(os.cpu_count() or 1, math.ceil(num_cpus)),
                            **({"_temp_dir": str(temp)} if temp is not None else {}), **kwargs)
            self.started = True
        else:
            kwargs.pop("include_dashboard")  # a joined cluster's dashboard is its own business
            ray.init(address=address, **kwargs)
        self.connected = True

    def driver_node(self) -> str | None:
        """The Ray node this driver runs on (None through Ray Client: the driver is on no node)."""
        return None if self.client else self.ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        if self.connected and self.ray.is_initialized():
            self.ray.shutdown()  # stops a local instance we started; only disconnects from a cluster
        self.connected = False
        self._settle_temp()

    def _settle_temp(self) -> None:
        """A short temp dir (taken when RUN_DIR/ray was too long a path for Ray's sockets) is
        moved into the run directory once Ray is down, so no temp dir outlives the run and the
        actors' logs stay with it."""
        temp, self.temp = self.temp, None
        if temp is None or not self.started or temp.parent != Path(tempfile.gettempdir()):
            return
        link = self.run_link
        try:
            if link is not None and link.is_symlink() and link.resolve() == temp.resolve():
                link.unlink()
                shutil.move(str(temp), str(link))  # sockets are gone with Ray; logs move
            else:
                shutil.rmtree(temp)
        except OSError:
            shutil.rmtree(temp, ignore_errors=True)

