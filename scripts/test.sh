#!/usr/bin/env bash
# The test command: sets up .venv if needed, runs every test, fails when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import vllm, ray" 2>/dev/null || bash scripts/setup.sh
source scripts/env.sh
set +e
# --durations: the slowest tests in every log (CI aims at 45 minutes; machines differ 2x)
.venv/bin/python -m pytest -q -ra --durations=25 "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
if [ "$rc" = 5 ]; then echo "no tests ran: failing" >&2; exit 1; fi
exit "$rc"
