"""bench_serve --hops reads each request's time at the ingress and at the model replica from the
access lines `serve run` relays: the parser, on lines as Ray 2.60 writes them (copied from a run
on the CPU default)."""

from __future__ import annotations

from benchmarks.bench_serve import access_times

A, B, C = ("16181e8e-b537-40e1-8762-f742c6a828c7", "5af6465d-9578-42c3-b169-27f532b03c6e",
           "778d32ea-78fb-4558-8fdd-70842b48fc3b")
LOG = f"""\
(ServeReplica:ternary-embeddings:TernaryIngress pid=6599) INFO 2026-12-03 06:45:55,115 ternary-embeddings_TernaryIngress thulrh9t {A} -- POST /v1/embeddings 200 301.1ms
(ServeReplica:ternary-embeddings:TernaryLLMServer:minilm-ternary pid=6691) INFO 2026-12-03 06:45:55,111 ternary-embeddings_TernaryLLMServer:minilm-ternary xis3dlp4 {A} -- CALL embeddings OK 23.3ms
(ServeReplica:ternary-embeddings:TernaryIngress pid=6599) INFO 2026-12-03 06:45:56,002 ternary-embeddings_TernaryIngress thulrh9t {B} -- POST /v1/embeddings 503 13.9ms
(ServeReplica:ternary-embeddings:TernaryLLMServer:minilm-ternary pid=6691) INFO 2026-12-03 06:45:56,110 ternary-embeddings_TernaryLLMServer:minilm-ternary xis3dlp4 {C} -- CALL embeddings OK 9.5ms
(ServeReplica:ternary-embeddings:TernaryLLMServer:minilm-ternary pid=6691) INFO 2026-12-03 06:45:56,120 ternary-embeddings_TernaryLLMServer:minilm-ternary xis3dlp4 {C} -- CALL check_health OK 2.8ms
"""


def test_access_times_pair_each_request_with_its_ingress_and_replica_lines():
    ingress, replica = access_times(LOG, {A, B, C})
    assert ingress == {A: 301.1}  # B's 503 is no served request; C's ingress line is not in the log yet
    assert replica == {A: 23.3, C: 9.5}  # the health check's CALL line is not an embeddings call
    assert access_times(LOG, {"0e0e0e0e-0000-0000-0000-000000000000"}) == ({}, {})
