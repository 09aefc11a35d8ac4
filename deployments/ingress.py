"""The HTTP surface: Ray Serve LLM's OpenAI ingress (``/v1/embeddings``, ``/v1/models``;
vLLM's OpenAI protocol models and error schema), plus what production needs in front of
it: an optional Bearer key (401), a body-size bound (413), an input-count bound (400),
503 with Retry-After when the replicas' queues are full, and ``GET /health``."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import Optional

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments import compat
from deployments.server import EmbeddingJSON

compat.bind_replica_grpc_to_node_ip()  # loopback means loopback (see compat)

OpenAiIngress, init, EmbeddingRequest = compat.ingress_base()
_call_timeout, _CALL_TIMEOUT_S, ErrorResponse, OpenAIHTTPException = compat.ingress_call_parts()

RETRY_AFTER_S = "1"
# OpenAI's error kinds by status; every error the ingress sends carries one of them.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 415: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
# Ray Serve LLM's messages: "Message: <what>, Internal exception: <class and text>, original
# exception: ..." with " (Request ID: <id>)" appended: only <what> is for the client.
_WRAPPED_MESSAGE = re.compile(r"^Message: (?P<what>.*?)(?: \(Request ID: [^)]*\))?, Internal exception: ", re.S)
_REQUEST_ID = re.compile(r" ?\(Request ID: [^)]*\)")


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def openai_error(status: int, message: str, type_: str | None = None, param: Optional[str] = None,
                 headers=None) -> JSONResponse:
    """The OpenAI error schema: {"error": {"message", "type", "param", "code"}}; 503s say when to retry."""
    body = {"error": {"message": message, "type": type_ or error_type(status), "param": param, "code": status}}
    headers = dict(headers or {})
    # case-blind: a response reshaped by normalized_error already carries "retry-after"; adding
    # "Retry-After" beside it sent the header twice ("1, 1" to a client that joins them)
    if status == 503 and not any(k.lower() == "retry-after" for k in headers):
        headers["Retry-After"] = RETRY_AFTER_S
    return JSONResponse(body, status_code=status, headers=headers or None)


def client_message(message: str) -> str:
    """What an error message tells the client: no wrapper, no internal exception, no request id."""
    m = _WRAPPED_MESSAGE.match(message)
    return _REQUEST_ID.sub("", m.group("what") if m else message).strip()


def normalized_error(status: int, raw_headers: list[tuple[bytes, bytes]], raw: bytes) -> JSONResponse:
    """A JSON error a layer below wrote (Ray Serve LLM's handlers, vLLM's serving layer, FastAPI), in
    the one OpenAI shape: code = the status, type = OpenAI's kind, the message without internals;
    its other headers (Retry-After, x-request-id) kept."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        err = None
    if not isinstance(err, dict):
        err = {"message": raw.decode(errors="replace")[:500] or "error"}
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers
               if k.lower() not in (b"content-length", b"content-type")}
    return openai_error(status, client_message(str(err.get("message", ""))),
                        param=err.get("param") if isinstance(err.get("param"), str) else None, headers=headers)


def build_fastapi_app(*, api_key: Optional[str], max_body_bytes: int, max_inputs: int):
    """Ray Serve LLM's app (exception handling, CORS, metrics, request ids) + our guards."""
    app = init()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # e.g. the ingress's 404 for an unknown model: same schema as every other error
        return openai_error(exc.status_code, str(exc.detail), param="model" if exc.status_code == 404 else None)

    @app.exception_handler(RequestValidationError)
    async def schema_error(request: Request, exc: RequestValidationError):
        # Ray Serve LLM's own handler answers with pydantic's names as `type`, "invalid_parameter"
        # as `code` and the bad value as `param`; OpenAI's shape has the field name there.
        errors = exc.errors() or [{"loc": ("body",), "msg": "invalid request"}]
        first = errors[0]
        field = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
        where = f"field {field!r}" if field else "request body"
        return openai_error(400, f"{where}: {first.get('msg', 'invalid value')}", param=field)

    # added last: the outermost layer, it sees every request first and every response last
    app.add_middleware(Guards, api_key=api_key, max_body_bytes=max_body_bytes, max_inputs=max_inputs)
    return app


class Guards:
    """The checks in front of ``/v1/*`` (API key, Content-Type, body size, input count) and the one
    error shape of its responses, as a plain ASGI middleware. Starlette's ``BaseHTTPMiddleware`` runs
    each request through an extra task and memory stream: the two it replaces cost 0.6-0.8 ms a
    request on the 2-core EPYC (docs/operations.md)."""

    def __init__(self, app, *, api_key: Optional[str], max_body_bytes: int, max_inputs: int):
        self.app, self.api_key, self.max_body_bytes, self.max_inputs = app, api_key, max_body_bytes, max_inputs

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        refusal, receive = await self._check(scope, Headers(scope=scope), receive)
        if refusal is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, _one_error_shape(send))

    async def _check(self, scope, headers: Headers, receive):
        """(the refusal or None, the receive that replays a body already read)."""
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not given or not hmac.compare_digest(given.encode(), self.api_key.encode()):
                return openai_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'"), receive
        if scope["method"] != "POST":
            return None, receive
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return openai_error(415, f"Content-Type {kind or '(none)'!r}: send the request as application/json",
                                param="Content-Type"), receive
        length = headers.get("content-length", "")
        if length and not length.isdigit():
            return openai_error(400, f"Content-Length {length!r} is not a byte count", param="Content-Length"), receive
        # The declared length refuses a large body before it is read; counting while reading
        # catches chunked uploads that declare none (and stops reading them at the limit).
        if length and int(length) > self.max_body_bytes:
            return _too_large(int(length), self.max_body_bytes), receive
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nothing to answer
                return _no_answer, receive
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return _too_large(size, self.max_body_bytes, more=message.get("more_body", False)), receive
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if scope["path"] == "/v1/embeddings":
            problem = _input_problem(body, self.max_inputs)
            if problem:
                return openai_error(400, problem, param="input"), receive
        return None, _replay(body, receive)


async def _no_answer(scope, receive, send):
    return None


def _replay(body: bytes, receive):
    """A receive that hands the app the body already read, then the client's own messages."""
    pending = True

    async def replay():
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _one_error_shape(send):
    """A send that reshapes a JSON error response (status >= 400) with normalized_error; every
    other response passes through unbuffered."""
    held: dict | None = None
    chunks: list[bytes] = []

    async def shaped(message):
        nonlocal held
        if message["type"] == "http.response.start":
            kind = Headers(raw=message.get("headers", [])).get("content-type", "")
            if message["status"] >= 400 and kind.startswith("application/json"):
                held = message
                return
        elif held is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            response = normalized_error(held["status"], held.get("headers", []), b"".join(chunks))
            await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
            await send({"type": "http.response.body", "body": response.body})
            return
        await send(message)

    return shaped


def _too_large(size: int, limit: int, more: bool = False) -> JSONResponse:
    of = f"more than {size} bytes" if more else f"{size} bytes"
    return openai_error(413, f"request body of {of} is larger than the limit of {limit} bytes")


def _input_problem(body: bytes, max_inputs: int) -> Optional[str]:
    """Checks vLLM's request model leaves to the engine: empty inputs, too many inputs."""
    try:
        data = json.loads(body)
    except ValueError:
        return "request body is not valid JSON"
    except RecursionError:  # json's parser recurses once per nesting level
        return "request body nests JSON too deeply to parse"
    if not isinstance(data, dict):
        return "request body must be a JSON object"
    value = data.get("input")
    if value is None:
        return None  # the protocol model reports the missing field
    if value == "" or value == []:
        return "input must not be empty"
    if isinstance(value, list):
        if len(value) > max_inputs:
            return f"input has {len(value)} items; at most {max_inputs} per request"
        if any(item == "" or item == [] for item in value):
            return "input must not contain empty strings or empty token lists"
    return None


class TernaryIngress(OpenAiIngress):
    """OpenAI ingress with a health route that asks every model's replicas, and a full
    replica queue answered as an OpenAI error with Retry-After."""

    # /health answers within this even while no replica can take the check (an engine still
    # loading, a replica being replaced): a load balancer's probe gets a 503, not a hang.
    HEALTH_TIMEOUT_S = 5.0

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        try:
            return await self._embeddings(body, request)
        except BackPressureError:
            return openai_error(503, "all replicas are at their queue limit; retry shortly")
        except (RayActorError, ActorUnavailableError):  # the replica itself died or is being replaced
            return openai_error(503, "the replica serving this request went away; retry shortly")

    async def _embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        """Ray Serve LLM's ``OpenAiIngress.embeddings``, with the response sent as vLLM encoded it
        where the replica is a TernaryLLMServer (EmbeddingJSON), else encoded by pydantic-core: Ray
        Serve LLM's ``JSONResponse(content=result.model_dump())`` took 1.4 ms for one 1024-float
        embedding and 69 ms for 256 of 384 floats on the 2-core EPYC, ``model_dump_json`` 0.3 and
        8.9 ms (the same floats; docs/operations.md)."""
        async with _call_timeout(_CALL_TIMEOUT_S):
            result = await self._get_response(body=body, call_method="embeddings", raw_request=request).__anext__()
        if isinstance(result, ErrorResponse):
            raise OpenAIHTTPException(message=result.error.message, status_code=result.error.code, type=result.error.type)
        if isinstance(result, EmbeddingJSON):  # TernaryLLMServer: vLLM's body, already encoded
            return Response(result.body, media_type=result.media_type)
        return Response(result.model_dump_json(), media_type="application/json")

    async def health(self) -> JSONResponse:
        async def check(handle) -> Optional[str]:
            try:
                await asyncio.wait_for(handle.check_health.remote(), self.HEALTH_TIMEOUT_S)
            except asyncio.TimeoutError:
                return f"no replica answered the health check within {self.HEALTH_TIMEOUT_S:g} s (starting or replaced?)"
            except Exception as exc:  # any failure of the replica's check is "unhealthy", by design
                return f"{type(exc).__name__}: {exc}"
            return None

        handles = self._default_serve_handles
        results = await asyncio.gather(*(check(handle) for handle in handles.values()))
        failures = {model_id: problem for model_id, problem in zip(handles, results) if problem is not None}
        if failures:
            return JSONResponse({"status": "unhealthy", "models": failures}, status_code=503)
        return JSONResponse({"status": "ok"})
