#!/usr/bin/env bash
# CI for the Python package: `pip install .` (with -Werror on the binding), then the pytest suite.
#
# torch: the suite's torch tests (autograd against torch's math SDPA, torch.compile) skip without torch.
# PyPI's torch for Linux is the CUDA build: measured here, `pip install torch` took 111 s and 115 s and brought
# ~3.0 GB of wheels (5.2 GB installed). That fits CI's budget, so when the interpreter has no torch this
# script installs it into a venv that sees the system site-packages (FLASHTILE_TORCH_VENV, kept between
# runs on the same machine) and runs the suite with that venv's python. FLASHTILE_CI_TORCH=0 skips it; a
# failed install (no disk, no network) is reported and the torch tests skip. The GPU script runs the same
# suite with its own torch.
#
# FLASHTILE_PIP_ARGS is added to the pip install (e.g. "--no-build-isolation --no-index --find-links DIR"
# on a machine without network access).
#
# Exit status: pytest's, except that "no tests collected" (pytest's 5) is reported and counts as success.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# CUDA: pyproject.toml passes FLASHTILE_WITH_CUDA (default AUTO) to CMake. On a machine without a GPU the
# CUDA kernels could not run in these tests and would only cost compile time, so the default here is OFF
# there and AUTO where nvidia-smi finds a GPU; set FLASHTILE_WITH_CUDA to choose.
if [ -z "${FLASHTILE_WITH_CUDA:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then FLASHTILE_WITH_CUDA=AUTO; else FLASHTILE_WITH_CUDA=OFF; fi
fi
export FLASHTILE_WITH_CUDA
echo "== pip install .[test]  (FLASHTILE_WERROR=ON, FLASHTILE_WITH_CUDA=$FLASHTILE_WITH_CUDA)"
FLASHTILE_WERROR=ON "$PY" -m pip install --quiet --disable-pip-version-check ${FLASHTILE_PIP_ARGS:-} ".[test]"

TEST_PY=$PY
if ! "$PY" -c "import torch" 2>/dev/null && [ "${FLASHTILE_CI_TORCH:-1}" = 1 ]; then
  VENV=${FLASHTILE_TORCH_VENV:-$HOME/.cache/flashtile/torch-venv}
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    mkdir -p "$(dirname "$VENV")"
    free_gb=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print int($4 / 1048576)}')
    if [ "${free_gb:-0}" -lt 8 ]; then
      echo "WARNING: ${free_gb} GB free; not installing torch (needs ~6 GB): torch tests will skip"
    else
      echo "== installing torch into $VENV"
      start=$(date +%s)
      if "$PY" -m venv --system-site-packages "$VENV" &&
         "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch; then
        echo "torch installed in $(( $(date +%s) - start )) s"
      else
        echo "WARNING: torch install failed: torch tests will skip"
      fi
    fi
  fi
  if "$VENV/bin/python" -c "import torch" 2>/dev/null; then TEST_PY=$VENV/bin/python; fi
fi
"$TEST_PY" -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "torch: not installed"

echo "== pytest tests/python"
set +e
"$TEST_PY" -m pytest tests/python -p no:cacheprovider -rs
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests in tests/python"
  rc=0
fi
exit "$rc"
