#!/usr/bin/env bash
# CI for the Python package: `pip install .` (with -Werror on the binding), then the pytest suite.
#
# It runs in the venv that scripts/setup.sh (called by scripts/test.sh) fills with the test dependencies
# (pytest, numpy, ml_dtypes, torch): $FLASHTILE_VENV, default ~/.cache/flashtile/venv. PYTHON=<interpreter>
# uses another interpreter instead. The torch tests (autograd against torch's math SDPA, torch.compile) skip
# without torch; the GPU script runs the same suite with its own torch.
#
# FLASHTILE_PIP_ARGS is added to the pip install (e.g. "--no-build-isolation --no-index --find-links DIR"
# on a machine without network access).
#
# Exit status: pytest's. "No tests collected" (pytest's 5) is a failure: tests/python exists, so a run that
# collects nothing has tested nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FLASHTILE_VENV:-$HOME/.cache/flashtile/venv}
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ -x "$VENV/bin/python" ]; then
  PY=$VENV/bin/python
else
  echo "ci_python.sh: no venv at $VENV; run 'bash scripts/setup.sh test' first (or set PYTHON)" >&2
  exit 1
fi

# CUDA: pyproject.toml passes FLASHTILE_WITH_CUDA (default AUTO) to CMake. On a machine without a GPU the
# CUDA kernels could not run in these tests and would only cost compile time, so the default here is OFF
# there and AUTO where nvidia-smi finds a GPU; set FLASHTILE_WITH_CUDA to choose.
if [ -z "${FLASHTILE_WITH_CUDA:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then FLASHTILE_WITH_CUDA=AUTO; else FLASHTILE_WITH_CUDA=OFF; fi
fi
export FLASHTILE_WITH_CUDA
# Without build isolation, so that the build sees this interpreter's torch and compiles flashtile._torch_ext
# against it (setup.sh installs the build requirements into the venv); with torch present the extension must
# then load, which tests/python/test_torch_extension.py checks (FLASHTILE_REQUIRE_TORCH_EXT=1).
if "$PY" -c "import torch; print('torch', torch.__version__)" 2>/dev/null; then
  export FLASHTILE_REQUIRE_TORCH_EXT=1 FLASHTILE_TORCH_EXT=ON
else
  echo "torch: not installed"
fi
echo "== pip install .[test] with $PY  (FLASHTILE_WERROR=ON, FLASHTILE_WITH_CUDA=$FLASHTILE_WITH_CUDA)"
FLASHTILE_WERROR=ON "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  ${FLASHTILE_PIP_ARGS:-} ".[test]"

echo "== pytest tests/python"
set +e
"$PY" -m pytest tests/python -p no:cacheprovider -rs
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "ci_python.sh: FAIL: pytest collected no tests in tests/python"
fi
exit "$rc"
