"""sssd.engine.rowops: argmax and top-k of logit rows read from chunk maxima equal torch's."""

import pytest
import torch
from sssd.engine.rowops import CHUNK, argmax_rows, topk_rows

VOCABS = [49152, 32000, 50257, CHUNK * 3 + 1, 600, 7]  # whole chunks, a tail, too short for chunks


def rows(v: int, seed: int, dtype=torch.float32, n: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g).to(dtype)


def with_ties(v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (5, v), generator=g).float()  # every value repeated many times


def check_topk(x: torch.Tensor, k: int) -> None:
    want_v, want_i = torch.topk(x, k, dim=-1)
    got_v, got_i = topk_rows(x, k)
    assert got_i.dtype == torch.int64 and got_i.shape == want_i.shape
    assert torch.equal(got_v.isnan(), want_v.isnan())
    assert torch.equal(torch.nan_to_num(got_v), torch.nan_to_num(want_v))
    # each index names its value, no index twice
    picked = torch.gather(x, 1, got_i)
    assert torch.equal(torch.nan_to_num(picked), torch.nan_to_num(got_v))
    for r in got_i.tolist():
        assert len(set(r)) == len(r)


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_equals_torch(v, dtype):
    for seed in range(3):
        x = rows(v, seed, dtype)
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
        t = with_ties(v, seed).to(dtype)
        assert torch.equal(argmax_rows(t), t.argmax(dim=-1))  # the first of equal maxima


@pytest.mark.parametrize("v", VOCABS)
def test_argmax_nan_inf_and_the_tail(v):
    x = rows(v, 0)
    x[0, v // 2] = float("nan")
    x[1, v - 1] = float("nan")  # in the tail where there is one
    x[1, v // 3] = float("nan")
    x[2] = float("-inf")
    x[3, v - 1] = float("inf")
    x[4, v - 1] = 100.0  # the largest logit last
    x[5, 0] = float("inf")
    x[5, v - 1] = float("inf")
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    y = rows(v, 1)
    y[:, -1] = float("nan")  # NaN only at the end
    assert torch.equal(argmax_rows(y), y.argmax(dim=-1))


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("k", [1, 2, 8, 32])
def test_topk_equals_torch(v, k):
    if k > v:
        return
    for seed in range(3):
        x = rows(v, seed)
        check_topk(x, k)
        # distinct values (float32 normal draws): the same indices, in the same order
        assert torch.equal(topk_rows(x, k)[1], torch.topk(x, k, dim=-1).indices)
        check_topk(with_ties(v, seed), k)
        check_topk(rows(v, seed, torch.bfloat16), k)


@pytest.mark.parametrize("v", VOCABS)
def test_topk_nan_inf_and_the_tail(v):
    x = rows(v, 3)
    x[0, v // 2] = float("nan")
    x[1, v - 1] = float("nan")
    x[2] = float("-inf")
    x[3, v - 3 :] = float("inf")
    x[4, v - 2] = 50.0
    x[4, v - 1] = 40.0
    for k in (1, 4, 8):
        if k <= v:
            check_topk(x, k)


def test_strided_empty_and_one_row():
    x = rows(CHUNK * 10, 4, n=8)
    for y in (x[::2], x[:, : CHUNK * 7 + 5], x[:1], x[:0]):
        assert torch.equal(argmax_rows(y), y.argmax(dim=-1))
        check_topk(y, 3)
    t = x.t().contiguous().t()  # column-major rows: torch's functions
    assert torch.equal(argmax_rows(t), t.argmax(dim=-1))
    check_topk(t, 3)
