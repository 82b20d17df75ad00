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
    """_vec stacks with dtype promotion (one op on the step path): the values must be those of converting each."""
    from mgpucli.engine.tasks import _vec

    loss_sum, count = torch.tensor(1.2345678, dtype=torch.float32), torch.tensor(2**40 + 1)
    vec = _vec(torch.device("cpu"), loss_sum, count, 32)
    expected = torch.stack([loss_sum.to(torch.float64), count.to(torch.float64),
                            torch.tensor(32.0, dtype=torch.float64)])
    assert vec.dtype == torch.float64 and torch.equal(vec, expected)
    # without a float64 part, promotion alone would round the count through float32: each value is converted first
    vec = _vec(torch.device("cpu"), loss_sum, torch.tensor(2**25 + 1))
    assert vec.dtype == torch.float64 and vec[1].item() == 2**25 + 1


@pytest.mark.parametrize("task, shape, classes", [(Classification(), (16, 5), 5), (LanguageModel(), (4, 8, 7), 7)])
def test_step_pieces_add_up_to_the_same_sums_as_stats(task, shape, classes):
    """Training adds Task.step_stats pieces at the log interval; the sums must be stats()' sums, batch by batch."""
    from mgpucli.engine.interval import sum_step_rows

    gen = torch.Generator().manual_seed(1)
    acc, rows = torch.zeros(len(task.stat_names), dtype=torch.float64), []
    for size in (shape[0], shape[0], 3):  # a smaller last batch, as at the end of an epoch
        outputs = torch.randn(size, *shape[1:], generator=gen)
        targets = torch.randint(classes, (size, *shape[1:-1]), generator=gen)
        loss = task.loss(outputs, targets)
        acc += task.stats(outputs, targets, loss)
        rows.append(task.step_stats(outputs, targets, loss.detach()))
    summed = sum_step_rows(rows, torch.device("cpu"))
    assert summed.dtype == torch.float64 and torch.equal(summed, acc)


def test_later_pieces_fall_back_to_one_call_per_step_when_shapes_differ():
    from mgpucli.engine.interval import sum_step_rows
    from mgpucli.engine.tasks import Later, _correct

    a = (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))  # 1 correct
    b = (torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0]))  # 1 correct, 3 classes: no cat along dim 0
    rows = [(Later(_correct, *a), torch.tensor(2)), (_correct(*b), torch.tensor(1))]
    assert sum_step_rows(rows, torch.device("cpu")).tolist() == [2.0, 3.0]  # a Later and a tensor in one column
    rows = [(Later(_correct, *a),), (Later(_correct, *b),)]
    assert sum_step_rows(rows, torch.device("cpu")).tolist() == [2.0]


def test_a_stack_is_reused_only_for_the_very_same_tensors():
    from mgpucli.engine.interval import Stacked, column_sums

    losses = [torch.tensor(1.5), torch.tensor(2.5)]
    stacked = Stacked(losses, torch.stack(losses))
    assert stacked.of(list(losses)) is stacked.stacked
    others = [torch.tensor(1.5), torch.tensor(2.5)]  # equal values, other tensors: stacked afresh
    assert stacked.of(others) is not stacked.stacked and torch.equal(stacked.of(others), stacked.stacked)
    assert stacked.of(losses[:1]).tolist() == [1.5]
    rows = [((loss, 4), 4) for loss in losses]
    cpu = torch.device("cpu")
    reused = [t.item() for t in column_sums(rows, cpu, stacked)]
    assert reused == [t.item() for t in column_sums(rows, cpu)] == [16.0, 8.0]
