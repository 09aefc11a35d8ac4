"""Test support: code the tests run inside Serve replicas and vLLM workers (never shipped)."""
