"""Metric sums, exact validation batching and their reduction."""

import math

import pytest
import torch

from mgpucli.engine.data import FixedBatches
from mgpucli.engine.tasks import Classification, LanguageModel, Regression


@pytest.mark.parametrize("n, batch, world", [(101, 32, 1), (101, 32, 2), (101, 32, 3), (5, 8, 2), (64, 16, 4)])
def test_fixed_batches_count_every_sample_exactly_once(n, batch, world):
    seen = []
    for rank in range(world):
        for indices in FixedBatches(n, batch, rank, world):
            seen += indices
    assert sorted(seen) == list(range(n))


def test_fixed_batches_do_not_depend_on_the_process_count():
    one = list(FixedBatches(101, 32, 0, 1))
    two = {i: b for r in range(2) for i, b in zip(FixedBatches(101, 32, r, 2).batch_ids, FixedBatches(101, 32, r, 2),
                                                  strict=True)}
    assert [two[i] for i in range(len(one))] == one


def _per_batch_sums(task, outputs, targets, batches):
    return [task.stats(outputs[b], targets[b]).tolist() for b in batches]


def test_classification_sums_and_metrics():
    task = Classification()
    logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
    targets = torch.tensor([0, 1, 1])
    sums = task.stats(logits, targets).tolist()
    assert sums[1:] == [2.0, 3.0]
    expected_loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
    assert sums[0] == pytest.approx(expected_loss)
    m = task.metrics(sums)
    assert m["accuracy"] == pytest.approx(2 / 3) and m["loss"] == pytest.approx(expected_loss / 3)


def test_training_stats_reuse_the_mean_loss():
    task = Classification()
    logits, targets = torch.randn(8, 3), torch.randint(3, (8,))
    loss = task.loss(logits, targets)
    assert task.stats(logits, targets, loss)[0].item() == pytest.approx(loss.item() * 8)


def test_regression_and_language_model_metrics():
    reg = Regression()
    sums = reg.stats(torch.tensor([[1.0], [3.0]]), torch.tensor([[0.0], [1.0]])).tolist()
    assert reg.metrics(sums) == {"loss": 2.5, "mse": 2.5, "mae": 1.5}
    lm = LanguageModel()
    logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: loss ln 4, perplexity 4
    sums = lm.stats(logits, torch.zeros(2, 3, dtype=torch.long)).tolist()
    assert sums[1:] == [6.0, 2.0]
    m = lm.metrics(sums)
    assert m["loss"] == pytest.approx(math.log(4)) and m["perplexity"] == pytest.approx(4.0)


def test_summing_rows_in_batch_order_is_identical_for_any_split():
    """What evaluate() does: a rank fills its batches' rows, the sum over ranks fills the table exactly."""
    task = Classification()
    gen = torch.Generator().manual_seed(0)
    outputs, targets = torch.randn(101, 5, generator=gen), torch.randint(5, (101,), generator=gen)

    def table(world):
        t = torch.zeros(4, 3, dtype=torch.float64)
        for rank in range(world):
            part = torch.zeros_like(t)
            fb = FixedBatches(101, 32, rank, world)
            for i, idx in zip(fb.batch_ids, fb, strict=True):
                part[i] = task.stats(outputs[idx], targets[idx])
            t += part  # what all_reduce(SUM) computes: x + 0 is exact
        sums = [0.0, 0.0, 0.0]
        for row in t.tolist():
            sums = [a + b for a, b in zip(sums, row, strict=True)]
        return sums

    assert table(1) == table(2) == table(3)
    assert table(1)[2] == 101.0


def test_stats_vector_is_float64_and_exact_like_converting_each_value():
    from mgpucli.engine.tasks.base import _vec

    loss_sum, count = torch.tensor(1.2345678, dtype=torch.float32), torch.tensor(2**40 + 1)
    vec = _vec(torch.device("cpu"), loss_sum, count, 32)
    expected = torch.stack([loss_sum.to(torch.float64), count.to(torch.float64),
                            torch.tensor(32.0, dtype=torch.float64)])
    assert vec.dtype == torch.float64 and torch.equal(vec, expected)
    vec = _vec(torch.device("cpu"), loss_sum, torch.tensor(2**25 + 1))  # a count float32 could not hold exactly
    assert vec.dtype == torch.float64 and vec[1].item() == 2**25 + 1
