"""The Serve configs, shipped in the wheel as ``deployments.configs`` (pyproject.toml)."""
