"""The ingress's own per-request costs, in process (no Ray, no network): the app that
deployments/ingress.py builds, driven through ASGI with one 16-word embeddings request, against
Ray Serve LLM's bare app (its middlewares and FastAPI's parsing only); and the response's JSON
encoding, Ray Serve LLM's ``JSONResponse(content=model_dump())`` against pydantic-core's
``model_dump_json``. Prints ms per request; numbers quoted in docs/operations.md.

    .venv/bin/python benchmarks/probes/ingress_inproc.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from deployments.ingress import build_fastapi_app, init  # noqa: E402

BODY = json.dumps({"model": "m", "input": "the quick brown fox jumps over the lazy dog again and again ok"}).encode()
EMBEDDING = [0.0123456789] * 1024


def app_with_stub_handler(ours: bool):
    app = build_fastapi_app(api_key=None, max_body_bytes=1 << 20, max_inputs=2048) if ours else init()

    @app.post("/v1/embeddings")
    async def embeddings(request: dict):
        return JSONResponse({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": EMBEDDING}],
                             "model": request["model"], "usage": {"prompt_tokens": 16, "total_tokens": 16}})

    return app


async def one_request(app) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]
    sent = []

    async def receive():
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 200, sent


async def per_request_ms(app, n: int = 2000) -> float:
    for _ in range(200):
        await one_request(app)
    t = time.perf_counter()
    for _ in range(n):
        await one_request(app)
    return (time.perf_counter() - t) / n * 1e3


def encode_ms(fn, k: int = 20) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t) / k * 1e3


def main() -> None:
    for ours in (True, False):
        print(f"app, {'deployments.ingress' if ours else 'Ray Serve LLM bare'}: "
              f"{asyncio.run(per_request_ms(app_with_stub_handler(ours))):.3f} ms/request")
    from ray.llm._internal.serve.core.configs.openai_api_models import EmbeddingResponse

    for n, dim in ((1, 1024), (16, 1024), (256, 384)):
        data = [{"index": i, "object": "embedding", "embedding": torch.randn(dim).tolist()} for i in range(n)]
        r = EmbeddingResponse(id="x", created=0, model="m", data=data, usage={"prompt_tokens": 16, "total_tokens": 16})
        slow = encode_ms(lambda: JSONResponse(content=r.model_dump()).body)
        fast = encode_ms(lambda: r.model_dump_json().encode())
        print(f"encode {n} x {dim}: model_dump + JSONResponse {slow:.2f} ms, model_dump_json {fast:.2f} ms")


if __name__ == "__main__":
    main()
