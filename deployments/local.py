"""``ternary-serve serve CONFIG``: a private local Ray (loopback, its own ports and temp dir) and
``serve run CONFIG`` on it (``--deploy``: ``serve deploy`` through the dashboard instead), until
Ctrl-C or SIGTERM; then this cluster's processes, and only they, are stopped.

CONFIG is a Serve config file, or the name of one the package ships (``cpu``, ``tp1``, ...: the
files of the repository's configs/). A relative ``model`` path in it is taken from the caller's
working directory: the application is built inside the cluster, whose working directory is not
the caller's, so the config handed to Serve carries absolute paths.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

APP_IMPORT_PATH = "deployments.app:build_app"


@dataclass
class ClusterOptions:
    ray_port: int = 6390
    dashboard_port: int = 8265
    metrics_port: int = 8081
    temp_dir: Path = Path("/tmp/ternary-ray")
    # Ray's CPU count is a logical budget for placement: the ingress takes 0, each engine worker
    # cpus_per_worker; 8 leaves room for autoscaled replicas on a 2-core machine.
    num_cpus: int = 8
    deploy: bool = False
    # More Ray nodes on this machine (`ray start --address`, each with its own temp dir and
    # num_cpus CPUs): a multi-node cluster for tests and demos, replicas placed across nodes.
    worker_nodes: int = 0
    # HAProxy in front instead of Serve's Python proxy (RAY_SERVE_ENABLE_HA_PROXY=1; docs/operations.md)
    haproxy: bool = False

    def node_temp_dir(self, i: int) -> Path:
        """Node 0 is the head."""
        return self.temp_dir if i == 0 else Path(f"{self.temp_dir}-node{i}")


def shipped_configs() -> dict[str, Path]:
    """The Serve configs the package ships (configs/*.yaml of the repository), by stem."""
    root = resources.files("deployments.configs")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}


def find_config(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_configs()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise FileNotFoundError(f"no Serve config {name_or_path!r}: not a file, nor one of the shipped configs "
                            f"{sorted(shipped)}")


def resolved_config(path: Path, cwd: Path) -> dict:
    """The Serve config with each ternary application's relative ``model`` made absolute against
    ``cwd``, checked before any process starts (the typed args, and that the model exists)."""
    from deployments.config import TernaryServeConfig

    config = yaml.safe_load(path.read_text())
    for app in config.get("applications", []):
        if app.get("import_path") != APP_IMPORT_PATH:
            continue
        args = app.setdefault("args", {})
        if "model" in args and not Path(args["model"]).expanduser().is_absolute():
            args["model"] = str((cwd / args["model"]).resolve())
        cfg = TernaryServeConfig.model_validate(args)
        cfg.check_model_dir()
        cfg.check_exposure(str((config.get("http_options") or {}).get("host", "127.0.0.1")))
    return config


def http_port(config: dict) -> int:
    return int((config.get("http_options") or {}).get("port", 8000))


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what: str, seconds: float, check, log: Path) -> None:
    """Poll ``check()`` once a second; on timeout name what never came up, with the end of the log."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(1)
    tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
    raise RuntimeError(f"{what} did not come up within {seconds:.0f} s; end of {log}:\n" + "\n".join(tail))


SETTINGS_PREFIX = "ternary-serve cluster settings: "

# HAProxy's config file (RAY_SERVE_ENABLE_HA_PROXY=1) under the cluster's temp dir: Ray's default,
# /tmp/haproxy-serve/<node>/haproxy.cfg, names no cluster, and HAProxy outlives the proxy actor that
# spawns it (it kept port 8000 for the next cluster); its command line (`-f <file>`) now names this
# cluster, so `stop` finds it. Its sockets stay where Ray puts them: HAProxy refuses a socket path
# over 97 bytes, and <temp dir>/<56-character node id>/metrics.sock is near that.
HAPROXY_CONFIG = "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"
# HAProxy reserves ~2.5 file descriptors a connection it may hold (50,036 for 20,000, seen on the
# lent H200) and refuses to start above the process's hard limit: Ray 2.57.1's default maxconn
# (20,000) failed there (hard limit 20,000). Ray 2.60's default, 4096, capped by that limit.
HAPROXY_MAXCONN = "RAY_SERVE_HAPROXY_MAXCONN"
HAPROXY_MAXCONN_DEFAULT = 4096


def haproxy_maxconn(fd_hard_limit: int) -> int:
    """The connections HAProxy is allowed: Ray 2.60's default where the descriptors allow it."""
    return max(64, min(HAPROXY_MAXCONN_DEFAULT, int((fd_hard_limit - 200) / 2.5)))


def haproxy_env(temp_dir: Path) -> dict[str, str]:
    """Where HAProxy's config goes and how many connections it may hold; what the caller set keeps
    its value (a config path of its own: HAProxy is then found by it instead)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    maxconn = haproxy_maxconn(hard if hard != resource.RLIM_INFINITY else 1 << 20)
    return {HAPROXY_CONFIG: os.environ.get(HAPROXY_CONFIG, str(temp_dir / "haproxy" / "haproxy.cfg")),
            HAPROXY_MAXCONN: os.environ.get(HAPROXY_MAXCONN, str(maxconn))}


def haproxy_match(cluster_env: dict[str, str]) -> str:
    """What HAProxy's command line holds for this cluster: the directory of its config file."""
    return os.path.dirname(cluster_env[HAPROXY_CONFIG]) + "/"


def settings_line(cluster_env: dict[str, str]) -> str:
    return SETTINGS_PREFIX + " ".join(f"{k}={v}" for k, v in cluster_env.items())


def ray_cli() -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts"]


def serve_cli() -> list[str]:
    return [sys.executable, "-m", "ray.serve.scripts"]


class LocalCluster:
    """A Ray head on 127.0.0.1 whose processes all carry ``temp_dir`` in their command line (so
    they, and no other cluster's, can be found and stopped)."""

    def __init__(self, opts: ClusterOptions, config: dict):
        from ternary_plugin import envs

        self.opts = opts
        self.config = config
        self.address = f"127.0.0.1:{opts.ray_port}"
        self.log = Path(f"{opts.temp_dir}.log")
        self.cluster_env = envs.cluster_env()
        if opts.haproxy:
            self.cluster_env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        if self.cluster_env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
            self.cluster_env.update(haproxy_env(opts.temp_dir))
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for port in (self.opts.ray_port, self.opts.dashboard_port):
            # A cluster stopped just before (the tests start one after another) may still hold
            # its ports for a few seconds; a new head on a held port starts without its dashboard.
            deadline = time.time() + 60
            while port_busy(port) and time.time() < deadline:
                time.sleep(1)
            if port_busy(port):
                raise RuntimeError(f"port {port} is still in use after 60 s: another Ray is running; stop it first")
        # The cluster's processes (controller, proxy, replicas) inherit the raylet's environment:
        # Serve's mode is set here, not in drivers (ternary_plugin/envs.py, kind "cluster").
        print(settings_line(self.cluster_env), flush=True)  # benchmarks/bench_serve.py records this line
        env = {**os.environ, **self.cluster_env}
        self.opts.temp_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*ray_cli(), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--port", str(self.opts.ray_port), "--num-cpus", str(self.opts.num_cpus),
               "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.opts.dashboard_port),
               "--temp-dir", str(self.opts.temp_dir), "--metrics-export-port", str(self.opts.metrics_port),
               "--disable-usage-stats"]
        with open(self.log, "w") as log:
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_until(f"the Ray head at {self.address}", 120,
                   lambda: subprocess.run([*ray_cli(), "status", "--address", self.address], env=env,
                                          capture_output=True).returncode == 0, self.log)
        for i in range(1, self.opts.worker_nodes + 1):
            node_dir = self.opts.node_temp_dir(i)
            node_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-c", "import sys; from deployments import compat; compat.run_worker_node("
                   "sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))",
                   self.address, str(self.opts.num_cpus), str(node_dir), str(self.opts.metrics_port + i)]
            with open(f"{node_dir}.log", "w") as log:
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        if self.opts.worker_nodes:
            want = self.opts.worker_nodes + 1
            wait_until(f"{want} Ray nodes at {self.address}", 120, lambda: self._alive_nodes(env) >= want, self.log)

    def _alive_nodes(self, env) -> int:
        """Alive nodes as the GCS sees them (a driver of its own: this process stays Ray-free)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        try:
            out = subprocess.run([sys.executable, "-c", code, self.address], env=env, capture_output=True, text=True,
                                 timeout=60).stdout.strip().splitlines()
        except subprocess.TimeoutExpired:
            return 0
        return int(out[-1]) if out and out[-1].isdigit() else 0

    def serve(self, config_path: Path) -> subprocess.Popen:
        """``serve run`` (or ``serve deploy``, then wait) of the resolved config on this cluster."""
        env = {**os.environ, "RAY_ADDRESS": self.address}
        if self.opts.deploy:
            # `serve deploy` hands the config to the dashboard and returns. The dashboard's HTTP
            # server starts after the GCS answers `ray status` (seconds later on a loaded machine).
            url = f"http://127.0.0.1:{self.opts.dashboard_port}"
            wait_until(f"the Ray dashboard at {url}", 120, lambda: _http_ok(f"{url}/api/ray/version"), self.log)
            subprocess.run([*serve_cli(), "deploy", "--address", url, str(config_path)], env=env, check=True)
            proc = subprocess.Popen(["sleep", "infinity"])
        else:
            proc = subprocess.Popen([*serve_cli(), "run", "--address", self.address, str(config_path)], env=env)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Stop `serve run`, the `ray start --block` parent, then every Ray daemon whose command line
        names this cluster's private temp dir (gcs_server and raylet do; their workers exit with the
        raylet; HAProxy, which does not, names it through its config file), and wait until the HTTP
        port is closed so the next cluster does not meet the old proxy; say so if it stays open."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        time.sleep(2)
        patterns = [f"{self.opts.node_temp_dir(i)}/session" for i in range(self.opts.worker_nodes, -1, -1)]
        if HAPROXY_CONFIG in self.cluster_env:
            patterns.append(haproxy_match(self.cluster_env))
        for sig in ("-TERM", "-KILL"):
            for pattern in patterns:
                subprocess.run(["pkill", sig, "-f", "--", pattern], capture_output=True)
            time.sleep(3)
        # Replica and proxy workers exit on their own once the raylet is gone (seen: up to ~60 s).
        port = http_port(self.config)
        deadline = time.time() + 120
        while time.time() < deadline and port_busy(port):
            time.sleep(1)
        if port_busy(port):
            print(f"ternary-serve serve: port {port} still answers after this cluster stopped: a process this "
                  f"cluster did not start, or one it could not find, holds it (`ss -ltnp 'sport = :{port}'`)",
                  file=sys.stderr)
        deadline = time.time() + 30
        while time.time() < deadline and (port_busy(self.opts.dashboard_port) or port_busy(self.opts.ray_port)):
            time.sleep(1)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def serve_local(config: str, opts: ClusterOptions, cwd: Path | None = None) -> int:
    """Resolve and check the config, start the cluster, serve until interrupted, stop the cluster.
    Returns the exit code of `serve run` (143 after SIGTERM, 130 after Ctrl-C)."""
    resolved = resolved_config(find_config(config), cwd or Path.cwd())
    port = http_port(resolved)
    if port_busy(port):
        print(f"port {port} already answers: another Serve is running; stop it first", file=sys.stderr)
        return 1
    config_path = Path(f"{opts.temp_dir}.serve.yaml")
    config_path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    cluster = LocalCluster(opts, resolved)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 1
    try:
        cluster.start()
        print(f"serving {shlex.quote(str(config_path))} on {cluster.address}: "
              f"http://127.0.0.1:{port} (Ctrl-C stops)", flush=True)
        code = cluster.serve(config_path).wait()
    except SystemExit as exc:
        code = int(exc.code or 0)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"ternary-serve serve: {exc}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop itself is not interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
    return code
