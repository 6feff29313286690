"""bench/engine/bench_budgets.py's text measures (the timing itself is the benchmark's, not a test's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "engine"))
from bench_budgets import repeated_share


def test_repeated_share_counts_ngrams_that_repeat_within_their_own_output():
    loop = [1, 2, 3] * 3  # 3-grams 123 231 312 123 231 312 123: the last four repeat
    assert repeated_share([loop], n=3) == (4, 7)
    # the same n-grams in another output are not repeats: each output is its own text
    assert repeated_share([[1, 2, 3], [1, 2, 3]], n=3) == (0, 2)
    assert repeated_share([[1, 2], []], n=3) == (0, 0)  # shorter than n: nothing to count
    assert repeated_share(iter([[4, 4, 4, 4]]), n=2) == (2, 3)  # any iterable of outputs
