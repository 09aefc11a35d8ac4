"""Helpers for tests that run `serve run CONFIG` on a private local Ray (127.0.0.1)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import httpx

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


def start_serve(config: str, log_path, env_extra=None, timeout_s: float = 420):
    env = dict(os.environ, TERNARY_API_KEY=KEY, RAY_PORT="6391", RAY_TMP=RAY_TMP, DASHBOARD_PORT="8266",
               METRICS_PORT=str(METRICS_PORT),
               **(env_extra or {}))
    log = open(log_path, "w")
    proc = subprocess.Popen(["bash", "scripts/serve_local.sh", str(config)], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
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
    """SIGTERM the script's process group; its trap stops this cluster's Ray daemons."""
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


def offline_embeddings(model_dir, texts, tp=1):
    """The same texts through offline vLLM (scripts/embed.py), float32."""
    import json
    import sys

    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_CPU_OMP_THREADS_BIND="0|1" if tp > 1 else "0-1",
               VLLM_CPU_KVCACHE_SPACE="1")
    proc = run_engine([sys.executable, "scripts/embed.py", str(model_dir), "--tp", str(tp), "--dtype", "float32", *texts],
                      env, cwd=REPO)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])


@contextlib.contextmanager
def serving(config: str, log_dir, env_extra=None):
    """`serve run CONFIG` for the duration of a with-block; yields the model directory."""
    model = ensure_model()
    proc = start_serve(config, log_dir / "serve.log", env_extra=env_extra)
    try:
        yield model
    finally:
        stop_serve(proc)
