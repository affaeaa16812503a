#!/usr/bin/env bash
# The one list of what FlashTile needs, installed when missing. Called by the README's demo command
# (`setup.sh demo`), by the test command (scripts/test.sh runs `setup.sh test`) and so by CI (.ci/run).
#
#   demo  apt: cmake ninja-build g++ libopenblas-dev libgtest-dev (the cpu preset builds the tests too)
#   test  demo's list, plus apt: python3 python3-venv python3-dev ccache (scripts/test.sh: why);
#         the pinned CUTLASS/CuTe headers (pip nvidia-cutlass==4.2.0.0 --no-deps) when nvcc is found;
#         a Python venv ($FLASHTILE_VENV, default ~/.cache/flashtile/venv) holding the Python tests'
#         dependencies: pytest, numpy, ml_dtypes and torch (FLASHTILE_CI_TORCH=0 leaves torch out).
#
# Each item is checked first and installed only when missing, so a second run installs nothing and takes
# about a second. apt runs through sudo when not root; with neither, the script prints what it needs and
# exits 1. Everything installed is printed as "setup: installing ...".
#
# Why a venv: Debian 12's system pip refuses to install packages (PEP 668, "externally-managed-environment").
# The venv sees the system site-packages, so an interpreter that already has numpy or pytest is reused.
# scripts/ci_python.sh runs the Python tests with the venv's python; cmake/cutlass.cmake also looks for
# CUTLASS in that venv when the python3 on PATH has no cutlass_library.
set -euo pipefail
mode=${1:-test}
case $mode in
  demo|test) ;;
  *) echo "usage: bash scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac
VENV=${FLASHTILE_VENV:-$HOME/.cache/flashtile/venv}
CUTLASS_PIN=nvidia-cutlass==4.2.0.0

say() { echo "setup: $*"; }

# --- apt packages ---------------------------------------------------------------------------------------
apt_list=(cmake ninja-build g++ libopenblas-dev libgtest-dev)
if [ "$mode" = test ]; then apt_list+=(python3 python3-venv python3-dev ccache); fi

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${apt_list[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then missing+=("$p"); fi
  done
else
  say "no dpkg here (not Debian/Ubuntu): make sure these (or your distribution's equivalents) are installed:"
  say "  ${apt_list[*]}"
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo)
  elif command -v sudo >/dev/null 2>&1 && [ -t 0 ]; then
    say "sudo will ask for your password to install: ${missing[*]}"
    SUDO=(sudo)
  else
    say "missing Debian packages: ${missing[*]}"
    say "installing them needs root: run as root, or as a user with sudo, or ask an administrator for:"
    say "  apt-get install ${missing[*]}"
    exit 1
  fi
  say "installing with apt-get: ${missing[*]}"
  start=$(date +%s)
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "apt-get done in $(( $(date +%s) - start )) s"
else
  say "Debian packages present: ${apt_list[*]}"
fi
[ "$mode" = demo ] && exit 0

# --- the Python venv for the tests (and CUTLASS when python3 itself cannot install it) --------------------
PY=python3
venv_py=$VENV/bin/python
if [ ! -x "$venv_py" ]; then
  say "creating the Python venv $VENV (python3 -m venv --system-site-packages)"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv --system-site-packages "$VENV"
fi
pip_install() {  # pip_install <what to print> <pip args...>
  local what=$1; shift
  say "installing $what into $VENV"
  local start; start=$(date +%s)
  "$venv_py" -m pip install --quiet --disable-pip-version-check "$@"
  say "  done in $(( $(date +%s) - start )) s"
}

# CUTLASS/CuTe headers for the CUDA backend, only when nvcc exists (compiled, not run, without a GPU).
# cmake/cutlass.cmake imports cutlass_library with python3, then with the venv's python.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if "$PY" -c "import cutlass_library" 2>/dev/null || "$venv_py" -c "import cutlass_library" 2>/dev/null; then
    say "CUTLASS headers present (pip cutlass_library)"
  else
    pip_install "$CUTLASS_PIN (headers for the CUDA backend)" --no-deps "$CUTLASS_PIN"
  fi
else
  say "no nvcc: the CUDA backend is not built, CUTLASS not needed"
fi

# The Python tests' dependencies (pyproject.toml's [test] extra, plus torch for the autograd tests).
if "$venv_py" -c "import pytest, numpy, ml_dtypes" 2>/dev/null; then
  say "Python test dependencies present (pytest, numpy, ml_dtypes)"
else
  pip_install "pytest numpy ml_dtypes" "pytest>=7" "numpy>=1.22" "ml_dtypes>=0.2"
fi
# The build requirements from pyproject.toml (one list): scripts/ci_python.sh builds without isolation, so that the
# build sees the venv's torch and compiles flashtile._torch_ext against it.
build_reqs=$("$venv_py" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))")
if "$venv_py" -c "import scikit_build_core, nanobind" 2>/dev/null; then
  say "Python build requirements present (scikit-build-core, nanobind)"
else
  # shellcheck disable=SC2086
  pip_install "$build_reqs (the package's build requirements)" $build_reqs
fi
# torch: PyPI's Linux wheel is the CUDA build, ~3 GB to download and ~5 GB installed (measured ~2 min here).
if [ "${FLASHTILE_CI_TORCH:-1}" != 1 ]; then
  say "FLASHTILE_CI_TORCH=${FLASHTILE_CI_TORCH}: torch not installed, the torch tests will skip"
elif "$venv_py" -c "import torch" 2>/dev/null; then
  say "torch present ($("$venv_py" -c "import torch; print(torch.__version__)"))"
else
  free_gb=$(df -Pk "$VENV" | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "${free_gb:-0}" -lt 8 ]; then
    say "WARNING: ${free_gb} GB free under $VENV; not installing torch (needs ~6 GB): the torch tests will skip"
  elif ! pip_install "torch (~3 GB download)" torch; then
    say "WARNING: torch install failed: the torch tests will skip"
  fi
fi
