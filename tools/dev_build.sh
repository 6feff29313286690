#!/usr/bin/env bash
# In-place development build: compiles the native extension(s) into build/dev and copies them next to
# python/sssd, so `PYTHONPATH=python:. python -m pytest` tests the working tree without `pip install`.
# Extra arguments go to CMake (e.g. -DSSSD_TESTS=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" "$@" >/dev/null
cmake --build build/dev
find build/dev/csrc -maxdepth 2 -name '_*.so' -exec cp {} python/sssd/ \;
