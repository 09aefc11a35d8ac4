# Environment for the shell entry points and the tests; source it (the scripts do). The variables,
# with the reason for each, are defined once in ternary_plugin/envs.py; this exports its
# "engine" and "shell" entries (needs .venv: scripts/setup.sh).
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
eval "$("$REPO_ROOT/.venv/bin/python" -m ternary_plugin.envs "$REPO_ROOT")"
