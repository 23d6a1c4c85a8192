#!/usr/bin/env bash
# The whole test suite: unit and property tests, doctests, tutorial notebooks (nbval).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# Jupyter and IPython write into the home directory: keep test runs hermetic.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export HOME="$scratch/home" IPYTHONDIR="$scratch/ipython"
export JUPYTER_CONFIG_DIR="$scratch/jupyter/config" JUPYTER_DATA_DIR="$scratch/jupyter/data"
export JUPYTER_RUNTIME_DIR="$scratch/jupyter/runtime"
mkdir -p "$HOME"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

"$PY" -m pytest "$@"
if compgen -G "notebooks/*.ipynb" >/dev/null; then
  "$PY" -m pytest -p no:cacheprovider --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval-sanitize.cfg -o addopts="" notebooks/
fi
