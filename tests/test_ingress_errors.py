"""The ingress's HTTP surface without a cluster (FastAPI's TestClient on the app the ingress builds):
every refusal gets its 4xx in the one OpenAI error shape, and errors written by the layers below
(Ray Serve LLM, vLLM's serving layer) are reshaped: code = the status, OpenAI's `type`, the field
as `param`, a message without internals or request ids. Plus the closed-by-default rule."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("ray.serve.llm")

from fastapi import Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from ray.exceptions import ActorUnavailableError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from deployments.ingress import TernaryIngress, build_fastapi_app, client_message  # noqa: E402

KEY = "k-123"


class Body(BaseModel):
    model: str
    input: list[str]


def _client(api_key=KEY) -> TestClient:
    app = build_fastapi_app(api_key=api_key, max_body_bytes=32768, max_inputs=4)

    @app.post("/v1/embeddings")
    async def embeddings(body: Body):
        return {"data": body.input}

    @app.post("/v1/wrapped")
    async def wrapped():  # how Ray Serve LLM's handler writes an engine's 400
        msg = ("Message: dimensions is not supported by this model (Request ID: 1f2e), Internal exception: "
               "ray.llm._internal.serve.core.configs.openai_api_models.OpenAIHTTPException: ..., original exception: x")
        return JSONResponse({"error": {"message": msg, "type": "OpenAIHTTPException", "param": None, "code": 400}}, 400)

    @app.post("/v1/unavailable")
    async def unavailable():
        return JSONResponse({"error": {"message": "Internal Server Error", "type": "X", "code": 503}}, 503)

    return TestClient(app)


def _post(client, path="/v1/embeddings", body=None, content=None, key=KEY, kind="application/json"):
    headers = {"Content-Type": kind, **({"Authorization": f"Bearer {key}"} if key else {})}
    return client.post(path, content=content if content is not None else json.dumps(body), headers=headers)


def _error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    return err


CASES = [  # (name, request kwargs, status, type, param, words in the message)
    ("no key", dict(body={"model": "m", "input": ["a"]}, key=None), 401, "authentication_error", None, "API key"),
    ("text/plain", dict(content="hello", kind="text/plain"), 415, "invalid_request_error", "Content-Type", "application/json"),
    ("not JSON", dict(content="{nope"), 400, "invalid_request_error", "input", "not valid JSON"),
    ("deep JSON", dict(content="[" * 10_000 + "]" * 10_000), 400, "invalid_request_error", "input", "too deeply"),
    ("too large", dict(content=json.dumps({"model": "m", "input": ["w" * 40000]})), 413, "invalid_request_error", None, "limit of 32768"),
    ("too many", dict(body={"model": "m", "input": ["a"] * 5}), 400, "invalid_request_error", "input", "at most 4"),
    ("wrong type", dict(body={"model": "m", "input": "not a list"}), 400, "invalid_request_error", "input", "field 'input'"),
    ("missing", dict(body={"input": ["a"]}), 400, "invalid_request_error", "model", "field 'model'"),
]


@pytest.mark.parametrize("name,kwargs,status,kind,param,words", CASES, ids=[c[0] for c in CASES])
def test_refusals_in_one_openai_shape(name, kwargs, status, kind, param, words):
    err = _error(_post(_client(), **kwargs), status)
    assert err["type"] == kind and err["param"] == param and words in err["message"], err


def test_lower_layers_errors_are_reshaped_without_internals():
    err = _error(_post(_client(), "/v1/wrapped", body={}), 400)
    assert err == {"message": "dimensions is not supported by this model", "type": "invalid_request_error",
                   "param": None, "code": 400}


def test_503_says_when_to_retry():
    r = _post(_client(), "/v1/unavailable", body={})
    assert _error(r, 503)["type"] == "server_error" and r.headers["retry-after"] == "1"


class _Shaped(TernaryIngress):
    """The ingress whose call to the model's replicas meets a full queue (the router raises
    BackPressureError in the ingress's process) or a replica that died."""

    failure: Exception

    async def _get_response(self, **kwargs):  # an async generator, as Ray Serve LLM's: fails on first use
        raise self.failure
        yield


@pytest.mark.parametrize("failure,words", [
    (BackPressureError(num_queued_requests=2, max_queued_requests=2), "queue limit"),
    (ActorUnavailableError("replica restarting", b"\x00" * 16), "went away"),
], ids=["queue full", "replica gone"])
def test_full_queue_and_gone_replica_get_one_openai_503_with_one_retry_after(failure, words):
    ingress = _Shaped.__new__(_Shaped)  # no Serve handles: embeddings() is all that is called
    ingress.failure = failure
    app = build_fastapi_app(api_key=KEY, max_body_bytes=32768, max_inputs=4)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await ingress.embeddings(None, request)

    r = _post(TestClient(app), body={"model": "m", "input": ["a"]})
    assert words in _error(r, 503)["message"]
    assert r.headers.get_list("retry-after") == ["1"], r.headers  # once: was "1, 1" through the middleware


def test_a_good_request_passes_untouched():
    r = _post(_client(), body={"model": "m", "input": ["a", "b"]})
    assert r.status_code == 200 and r.json() == {"data": ["a", "b"]}


def test_client_message_keeps_plain_messages():
    assert client_message("input must not be empty") == "input must not be empty"
    assert client_message("too long (Request ID: x1)") == "too long"


@pytest.mark.parametrize("host,key,opt_out,ok", [
    ("127.0.0.1", None, False, True), ("::1", None, False, True), ("localhost", None, False, True),
    ("0.0.0.0", None, False, False), ("10.1.2.3", None, False, False), ("0.0.0.0", "s3cr3t-key", False, True),
    ("0.0.0.0", None, True, True)])
def test_closed_by_default(monkeypatch, host, key, opt_out, ok):
    from deployments.config import TernaryServeConfig

    monkeypatch.delenv("TERNARY_API_KEY", raising=False)
    cfg = TernaryServeConfig(model="m", api_key=key, allow_unauthenticated=opt_out)
    if ok:
        cfg.check_exposure(host)
    else:
        with pytest.raises(ValueError, match=r"no API key is set: export TERNARY_API_KEY=<key> on the cluster .*"
                                             r"allow_unauthenticated: true"):
            cfg.check_exposure(host)
    monkeypatch.setenv("TERNARY_API_KEY", "from-env")
    cfg.check_exposure(host)  # the key from the environment opens every host
    assert "from-env" not in repr(cfg) and (key is None or key not in repr(cfg))


async def _asgi_post(app, parts: list[bytes]):
    """POST /v1/embeddings straight into the ASGI app, the body in the given parts and no
    Content-Length (a chunked upload); (status, JSON body, parts the app read)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
    read, sent = 0, []

    async def receive():
        nonlocal read
        if read < len(parts):
            read += 1
            return {"type": "http.request", "body": parts[read - 1], "more_body": read < len(parts)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body), read


def test_chunked_upload_is_bounded_while_read_and_a_small_one_reaches_the_handler():
    """A body without Content-Length is counted as it is read: over the limit it is refused with
    413 before the rest is read; under it, the handler gets the whole body, parts joined."""
    import asyncio

    app = _client().app
    big = json.dumps({"model": "m", "input": ["w" * 40000]}).encode()
    parts = [big[i:i + 1000] for i in range(0, len(big), 1000)]
    status, body, read = asyncio.run(_asgi_post(app, parts))
    assert status == 413 and read == 33 < len(parts), (status, read)  # 33 parts: the first past 32768 bytes
    assert body["error"]["message"] == "request body of more than 33000 bytes is larger than the limit of 32768 bytes"
    small = json.dumps({"model": "m", "input": ["a" * 1500, "b"]}).encode()
    status, body, read = asyncio.run(_asgi_post(app, [small[:700], small[700:1400], small[1400:]]))
    assert (status, body, read) == (200, {"data": ["a" * 1500, "b"]}, 3)


class _Answers(TernaryIngress):
    """The ingress whose model replica answers with ``result`` (an EmbeddingResponse or an
    engine's ErrorResponse)."""

    result: object

    async def _get_response(self, **kwargs):
        assert kwargs["call_method"] == "embeddings"
        yield self.result


def _answered(result):
    ingress = _Answers.__new__(_Answers)  # no Serve handles: _get_response is replaced
    ingress.result = result
    app = build_fastapi_app(api_key=KEY, max_body_bytes=1 << 20, max_inputs=4)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await ingress.embeddings(None, request)

    return _post(TestClient(app), body={"model": "m", "input": ["a"]})


def test_embeddings_encoded_by_pydantic_core_carry_the_same_floats():
    """The response is encoded with model_dump_json instead of Ray Serve LLM's model_dump + JSONResponse:
    the same JSON values, every float exact (both write the shortest repr that round-trips)."""
    from ray.llm._internal.serve.core.configs.openai_api_models import EmbeddingResponse

    g = torch.Generator().manual_seed(0)
    data = [{"index": i, "object": "embedding", "embedding": (torch.randn(1024, generator=g, dtype=torch.float64)
                                                               * 10.0 ** torch.randint(-8, 8, (1024,), generator=g)).tolist()}
            for i in range(3)]
    result = EmbeddingResponse(id="e-1", created=1, model="m", data=data,
                               usage={"prompt_tokens": 5, "total_tokens": 5})
    r = _answered(result)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    assert r.json() == json.loads(JSONResponse(content=result.model_dump()).body)
    assert [d["embedding"] for d in r.json()["data"]] == [d["embedding"] for d in data]


def test_an_engines_error_answer_keeps_its_status_in_the_one_shape():
    from deployments import compat

    error_response = compat.ingress_call_parts()[2]
    result = error_response(error={"message": "dimensions is not supported by this model", "type": "BadRequestError",
                                   "code": 400})
    err = _error(_answered(result), 400)
    assert err["message"] == "dimensions is not supported by this model" and err["type"] == "invalid_request_error", err


def test_a_replicas_encoded_body_is_sent_unchanged():
    """TernaryLLMServer hands over vLLM's encoded response (EmbeddingJSON): the ingress sends its
    bytes and media type as they are, with no parse and no second encoding."""
    from deployments.server import EmbeddingJSON

    body = b'{"id":"e-1","object":"list","data":[{"index":0,"object":"embedding","embedding":[0.1,-2.5e-07]}]}'
    r = _answered(EmbeddingJSON(body, "application/json"))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    assert r.content == body


class _Serving:
    """vLLM's embeddings serving object as VLLMEngine holds it: answers with ``response`` or raises it."""

    def __init__(self, response):
        self.response = response

    async def __call__(self, request, raw_request=None):
        if isinstance(self.response, Exception):
            raise self.response
        return self.response


def _engine_answers(response, encoding_format="float"):
    """What the replica's engine (TernaryLLMServer's engine class) yields for one request whose
    serving layer answers with ``response``."""
    import asyncio
    from types import SimpleNamespace

    from deployments import compat
    from deployments.server import EmbeddingJSON

    class Base:  # the parts of Ray Serve LLM's VLLMEngine that its embeddings method uses
        def __init__(self):
            self._oai_serving_embedding = _Serving(response)

        def _validate_openai_serving_embedding(self):
            return None

        def _make_error_response(self, serving, exc):
            return compat.error_response(str(exc), 400, "BadRequestError")

    engine = compat.embedding_body_engine(Base, EmbeddingJSON)()
    request = SimpleNamespace(model="m", input="a", encoding_format=encoding_format, request_id="r-1")

    async def collect():
        return [item async for item in engine.embeddings(request, None)]

    return asyncio.run(collect())


def test_the_replicas_engine_yields_vllms_encoded_body():
    from fastapi.responses import StreamingResponse

    from deployments.server import EmbeddingJSON

    content = {"id": "e-1", "object": "list", "data": [{"index": 0, "object": "embedding", "embedding": [0.5, -1.25]}]}
    (item,) = _engine_answers(JSONResponse(content))  # vLLM's class without orjson (with it, ORJSONResponse)
    assert isinstance(item, EmbeddingJSON) and item.media_type == "application/json"
    assert json.loads(item.body) == content
    (item,) = _engine_answers(ValueError("This model's maximum context length is 256 tokens"))
    assert item.error.code == 400 and "maximum context length" in item.error.message
    (item,) = _engine_answers(StreamingResponse(iter([b"\x00"])), encoding_format="bytes")
    assert item.error.code == 400 and item.error.message.startswith("encoding_format 'bytes' is not served here"), item
