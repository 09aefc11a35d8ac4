"""Helpers for tests that run `ternary-serve serve CONFIG` (a private local Ray on 127.0.0.1 +
`serve run`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import yaml

from tests.conftest import REPO, run_engine

KEY = "test-key-123"
PORT = 8000  # from the configs
BASE = f"http://127.0.0.1:{PORT}"
MODEL = "minilm-ternary"
RAY_TMP = "/tmp/ternary-ray-test"
METRICS_PORT = 8091


def ensure_model():
    """models/minilm-ternary, as the main job makes it (the configs point there)."""
    dst = REPO / "models" / "minilm-ternary"
    if not (dst / "config.json").is_file():
        from ternary_plugin.convert import convert
        from tests.conftest import _minilm_src

        convert(src=_minilm_src(), dst=dst, quality_check=False, progress=False)
    return dst


def derived_config(base: str, path, **args) -> str:
    """A copy of the Serve config ``base`` (relative to the repository) with its application's
    ``args`` updated, written to ``path``."""
    cfg = yaml.safe_load((REPO / base).read_text())
    cfg["applications"][0]["args"].update(args)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def start_serve(config: str, log_path, env_extra=None, timeout_s: float = 420, deploy: bool = False, extra_args=()):
    """The cluster's processes get the repository root on PYTHONPATH, so that replicas can import
    tests/support (a test's config may name its classes); relative model paths are taken from the
    repository root (the working directory)."""
    env = dict(os.environ, TERNARY_API_KEY=KEY, PYTHONPATH=str(REPO), **(env_extra or {}))
    cmd = [sys.executable, "-m", "ternary_plugin.cli", "serve", str(config), "--ray-port", "6391",
           "--dashboard-port", "8266", "--metrics-port", str(METRICS_PORT), "--temp-dir", RAY_TMP,
           *(["--deploy"] if deploy else []), *extra_args]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited early:\n{open(log_path).read()[-4000:]}")
        if health_status() == 200:
            return proc
        time.sleep(3)
    stop_serve(proc)
    raise RuntimeError(f"serve not healthy in {timeout_s} s:\n{open(log_path).read()[-4000:]}")


def health_status() -> int | None:
    try:
        return httpx.get(f"{BASE}/health", timeout=10).status_code
    except httpx.HTTPError:
        return None


def stop_serve(proc):
    """SIGTERM the command's process group; it stops this cluster's Ray daemons before it exits."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def post(payload, key=KEY, content=None, timeout=60):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{BASE}/v1/embeddings", json=None if content else payload, content=content,
                      headers={**headers, "Content-Type": "application/json"}, timeout=timeout)


def config_engine(config: str) -> dict:
    """How a Serve config's one application runs its engine, as offline_embeddings' keywords:
    its dtype, and compiled unless it sets enforce_eager."""
    args = yaml.safe_load((REPO / config).read_text())["applications"][0]["args"]
    return {"dtype": args["dtype"], "compile": not args.get("enforce_eager", False)}


def offline_embeddings(model_dir, texts, out_json, tp=1, dtype="float32", compile=False):
    """The same texts through offline vLLM (`ternary-serve embed`) in ``dtype``, compiled or eager."""
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1" if tp > 1 else "0-1", VLLM_CPU_KVCACHE_SPACE="1")
    proc = run_engine([sys.executable, "-m", "ternary_plugin.cli", "embed", str(model_dir), "--tp", str(tp),
                       "--dtype", dtype, *(["--compile"] if compile else []), "--json", str(out_json), *texts],
                      env, cwd=REPO)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(out_json.read_text())


@contextlib.contextmanager
def serving(config: str, log_dir, env_extra=None, extra_args=(), timeout_s: float = 420):
    """`ternary-serve serve CONFIG` for the duration of a with-block; yields the model directory."""
    model = ensure_model()
    proc = start_serve(config, log_dir / "serve.log", env_extra=env_extra, extra_args=extra_args, timeout_s=timeout_s)
    RUNNING["proc"] = proc
    try:
        yield model
    finally:
        RUNNING.pop("proc", None)
        stop_serve(proc)


RUNNING: dict[str, subprocess.Popen] = {}  # the `ternary-serve serve` of the current serving() block


def listening_sockets(session_id: int) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN state owned by a process of the session
    ``session_id`` (`ternary-serve serve` starts its cluster in a session of its own), as `ss -ltnp`
    lists them, read from /proc."""
    import ipaddress
    import socket
    from pathlib import Path

    inodes = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc writes each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            inodes[fields[9]] = (str(ipaddress.ip_address(raw)), int(hex_port, 16))
    found = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            stat = (proc_dir / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) != session_id:  # field 6: the session id
                continue
            for fd in (proc_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    found.append((*inodes[target[8:-1]], int(proc_dir.name)))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we looked
    return sorted(set(found))
