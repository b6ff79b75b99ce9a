"""Sampling: greedy, filters, exact distribution, reproducible independent of batch layout."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.sampler import SamplingParams, filtered_probs, sample


def _logits(b=4, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, v, generator=g) * 2


def test_greedy_is_argmax():
    lg = _logits()
    assert torch.equal(sample(lg, [SamplingParams()] * 4, [0] * 4), lg.argmax(-1))
    assert torch.equal(sample(lg, [SamplingParams(temperature=1.0, top_k=1)] * 4, [3] * 4), lg.argmax(-1))


def test_seeded_draw_depends_on_seed_position_and_row_only():
    lg = _logits(6)
    ps = [SamplingParams(temperature=1.0, seed=s) for s in range(6)]
    full = sample(lg, ps, list(range(6)))
    for i in range(6):  # the same row alone, and among other neighbours in another order
        assert int(sample(lg[i:i + 1], [ps[i]], [i])[0]) == int(full[i])
        perm = [i] + [j for j in range(6) if j != i][::-1]
        other = sample(lg[perm], [ps[j] for j in perm], perm)
        assert int(other[0]) == int(full[i])
    draws = {int(sample(lg[:1], [SamplingParams(temperature=1.0, seed=7)], [pos])[0]) for pos in range(40)}
    assert len(draws) > 3  # positions get different streams


def test_draws_follow_the_filtered_distribution():
    lg = _logits(1, 8, seed=3)
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=0)
    probs = filtered_probs(lg, [p])[0]
    n = 4000
    counts = torch.zeros(8)
    for pos in range(n):
        counts[int(sample(lg, [p], [pos])[0])] += 1
    assert counts[probs == 0].sum() == 0  # never outside top-k / nucleus
    expected = probs * n
    keep = expected > 0
    chi2 = (((counts - expected)[keep]) ** 2 / expected[keep]).sum()
    assert chi2 < 30  # dof <= 4: p-value far below 1e-4 otherwise


def test_filters_keep_the_right_support():
    lg = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    top2 = filtered_probs(lg, [SamplingParams(temperature=1.0, top_k=2)])[0]
    assert (top2 > 0).tolist() == [True, True, False, False, False]
    soft = torch.softmax(lg[0].double(), -1)
    p = float(soft[0] + soft[1]) - 1e-9  # nucleus reached by the top two
    nucleus = filtered_probs(lg, [SamplingParams(temperature=1.0, top_p=p)])[0]
    assert (nucleus > 0).tolist() == [True, True, False, False, False]
    torch.testing.assert_close(nucleus[:2], soft[:2] / soft[:2].sum())


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(max_tokens=0)])
def test_invalid_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_params_carry_stop_and_length():
    p = SamplingParams(max_tokens=5, stop_token_ids=[2, 3])
    assert p.max_tokens == 5 and p.stop_token_ids == (2, 3)
