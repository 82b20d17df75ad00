"""End-to-end: recipes that train Hugging Face Transformers models (tiny ones from configs, a tokenizer trained on
local text, csv files written here), offline, with the guarantees of any recipe: exact validation on any process
count, bitwise resume, the model's own loss, token-weighted metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.hf_files import corpus_csv, make_tokenizer, offline_env, reviews_csv, text_recipe
from tests.inproc import cli
from tests.procs import load_ckpt, mgpu, torchrun

pytest.importorskip("transformers")  # the suite installs mgpu[hf] (requirements.txt); a bare install may not


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """A tokenizer, reviews (256 train, 72 val) and corpus lines (256 train, 70 val) as csv files."""
    folder = tmp_path_factory.mktemp("hf-text")
    make_tokenizer(folder / "tokenizer")
    reviews_csv(folder / "train.csv", 256, "train")
    reviews_csv(folder / "val.csv", 72, "val")
    corpus_csv(folder / "lm-train.csv", 256, "train")
    corpus_csv(folder / "lm-val.csv", 700, "val")  # the last 10% of 700 lines: 70
    return folder


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def validate(folder: Path, checkpoint: str, *args: str) -> dict:
    """``mgpu validate CHECKPOINT --json`` in a process of its own: datasets, which it imports, fixes its cache
    folder from the environment at its import (the 2-process `mgpu validate`: test_validate.py, test_fsdp.py)."""
    r = mgpu("validate", checkpoint, "trainer.cpu_threads=1", "--json", *args, cwd=folder, env=offline_env(folder))
    assert r.returncode == 0, r.output
    return json.loads(r.stdout)


def test_sequence_classification_trains_validates_exactly_and_resumes_bitwise(text_dir, monkeypatch):
    recipe = str(text_recipe(text_dir, "sequence_classification"))
    env = offline_env(text_dir)
    fresh_cache = {**env, "HF_HOME": str(text_dir / "hf-seq")}  # nothing tokenized yet
    full = mgpu("launch", "--cpu", "--nproc", "2", recipe, "run_dir=seq-full", cwd=text_dir, env=fresh_cache,
                timeout=180)
    assert full.returncode == 0, full.output
    # tokenized once per machine: one process of the two tokenized each file, the other read its result
    logs = [p.read_text(errors="replace") for p in (text_dir / "seq-full/logs").glob("*/attempt_0/*/stderr.log")]
    assert len(logs) == 2 and sum(log.count("tokenizing: 100%") for log in logs) == 2, logs
    assert len(list((text_dir / "hf-seq").rglob("mgpu-tokenized-*.arrow"))) == 2
    vals = [m for m in metrics(text_dir / "seq-full") if m["split"] == "val"]
    assert len(vals) == 2 and vals[-1]["samples"] == 72 and {"loss", "accuracy", "f1"} <= set(vals[-1])
    # exact validation: the 2-process run's own and the checkpoint's on 1 process, bitwise the same
    one = validate(text_dir, "seq-full/checkpoints/last.pt")
    assert {k: vals[-1][k] for k in ("loss", "accuracy", "f1")} == {k: one["metrics"][k] for k in
                                                                     ("loss", "accuracy", "f1")}
    _export_gives_the_checkpoints_logits(text_dir, "seq-full", monkeypatch)
    # stopped mid-epoch (16 steps an epoch: 256 rows / (16 x 2)), resumed: the uninterrupted run's weights, bitwise
    part = torchrun(2, "train", recipe, "run_dir=seq-part", "trainer.max_steps=11", cwd=text_dir, env=env)
    assert part.returncode == 0, part.output
    assert load_ckpt(text_dir / "seq-part/checkpoints/last.pt")["mid_epoch"]
    resumed = torchrun(2, "train", recipe, "run_dir=seq-part", "--resume", "auto", cwd=text_dir, env=env)
    assert resumed.returncode == 0, resumed.output
    a, b = load_ckpt(text_dir / "seq-full/checkpoints/last.pt"), load_ckpt(text_dir / "seq-part/checkpoints/last.pt")
    assert a["step"] == b["step"] == 16
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def _train_loss_of_epoch(run_dir: Path) -> float:
    trains = [m for m in metrics(run_dir) if m["split"] == "train"]
    tokens = sum(m["tokens"] for m in trains)
    return sum(m["loss"] * m["tokens"] for m in trains) / tokens


def test_causal_lm_token_metrics_are_exact_on_any_process_count_and_accumulation(text_dir):
    """With lr 0 and no dropout the weights never change, so every training step's loss is an evaluation: the
    epoch's train loss, over padded batches of different lengths, is the same token-weighted mean on 1 process, on
    2, and under gradient accumulation, and equals the exact validation of the train set."""
    recipe = str(text_recipe(text_dir, "causal_lm", arch="gpt2", train="lm-train.csv", val="lm-val.csv",
                             extra_model={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}))
    env = offline_env(text_dir)
    still = ["optim.lr=0.0", "trainer.epochs=1", "trainer.log_every=1"]
    runs = {"one": mgpu("train", recipe, *still, "run_dir=lm-one", cwd=text_dir, env=env),
            "two": torchrun(2, "train", recipe, *still, "run_dir=lm-two", cwd=text_dir, env=env),
            "accum": torchrun(2, "train", recipe, *still, "data.batch_size=8", "trainer.grad_accum=2",
                              "run_dir=lm-accum", cwd=text_dir, env=env)}
    for r in runs.values():
        assert r.returncode == 0, r.output
    exact = validate(text_dir, "lm-one/checkpoints/last.pt", "--split", "train")["metrics"]
    for name in runs:
        assert _train_loss_of_epoch(text_dir / f"lm-{name}") == pytest.approx(exact["loss"], rel=1e-5), name
    # the validation on 1 process is the 2-process run's own, bitwise
    one = validate(text_dir, "lm-one/checkpoints/last.pt")["metrics"]
    assert one["perplexity"] == pytest.approx(torch.tensor(one["loss"]).exp().item())
    vals = [m for m in metrics(text_dir / "lm-two") if m["split"] == "val"]
    assert vals[-1]["loss"] == one["loss"] and vals[-1]["samples"] == 70


def _export_gives_the_checkpoints_logits(folder: Path, run: str, monkeypatch, last: str = "last.pt") -> None:
    """``mgpu export``, then ``from_pretrained`` of what it wrote: the checkpoint's model, tokenizer and logits."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = f"{run}-exported"
    r = cli("export", run, out, "--json", cwd=folder, env=offline_env(folder))  # in this process
    assert r.returncode == 0, r.output
    done = json.loads(r.stdout)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(done["files"]) and done["tokenizer"]
    assert done["load_with"] == f"transformers.AutoModelForSequenceClassification.from_pretrained('{out}')"
    assert done["checkpoint"].endswith(last)
    again = cli("export", run, out, cwd=folder, env=offline_env(folder))  # never over files
    assert again.returncode == 2 and "not an empty directory" in again.stderr and "Traceback" not in again.output
    for name, value in offline_env(folder).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(folder)  # the recipe names the tokenizer relative to the run's working directory
    from mgpucli import load_checkpoint

    ours = load_checkpoint(folder / run / "checkpoints" / last).model
    theirs = AutoModelForSequenceClassification.from_pretrained(folder / out).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder / out)
    batch = tokenizer(["the film was lovely.", "sadly, the meal was dull and poor."], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(ours(**batch).logits, theirs(**batch).logits)


def test_dict_batches_under_fsdp_checkpointing_mixed_precision_ema_and_the_anatomy(text_dir, monkeypatch):
    """FSDP2 shards the Transformers layers (the blocks of its nn.ModuleList), the model's own gradient
    checkpointing recomputes them, bf16 autocast, EMA weights validated, the step anatomy in every train record;
    the checkpoint (sharded, FSDP's default) then validates on one process as the run did, and exports."""
    recipe = str(text_recipe(text_dir, "sequence_classification"))
    env = offline_env(text_dir)
    features = ["trainer.strategy=fsdp", "trainer.activation_checkpointing=true", "trainer.precision=bf16",
                "+trainer.ema={decay: 0.9, validate: true}", "trainer.anatomy=true", "trainer.max_steps=8",
                "trainer.grad_accum=2", "data.batch_size=8"]
    r = torchrun(2, "train", recipe, *features, "run_dir=seq-fsdp", cwd=text_dir, env=env)
    assert r.returncode == 0, r.output
    assert "activation checkpointing: 2 block(s) recompute their activations in backward" in r.stderr
    records = metrics(text_dir / "seq-fsdp")
    assert all(len(m["anatomy"]) == 2 for m in records if m["split"] == "train")
    val = [m for m in records if m["split"] == "val"][-1]
    assert val["weights"] == "ema"
    again = validate(text_dir, "seq-fsdp/checkpoints/last.dcp", "--weights", "ema")["metrics"]
    assert again["loss"] == pytest.approx(val["loss"], rel=1e-2)  # bf16 forwards: not bitwise across layouts
    _export_gives_the_checkpoints_logits(text_dir, "seq-fsdp", monkeypatch, last="last.dcp")


def test_the_fit_probe_measures_a_transformers_recipe(text_dir):
    recipe = str(text_recipe(text_dir, "causal_lm", arch="gpt2", train="lm-train.csv", val="lm-val.csv"))
    r = torchrun(2, "train", recipe, "--probe", "--probe-steps", "3", "--json", cwd=text_dir, env=offline_env(text_dir))
    assert r.returncode == 0, r.output
    report = json.loads(r.stdout)
    assert len(report["ranks"]) == 2 and report["step_time_s"] > 0
    assert not (text_dir / "runs").exists()  # the probe writes no run dir


@pytest.mark.parametrize("head", ["token_classification", "masked_lm"])
def test_token_classification_and_masked_lm_validate_exactly(text_dir, head):
    """Word tags aligned to sub-words (-100 on later pieces), and masked LM with a row's masks fixed by the seed:
    the validation of the checkpoint on 1 process equals the 2-process run's own."""
    from tests.hf_files import tagged_jsonl

    if head == "token_classification":
        tagged_jsonl(text_dir / "tags-train.jsonl", 256, "train")
        tagged_jsonl(text_dir / "tags-val.jsonl", 700, "val")
        recipe = text_recipe(text_dir, head, train="tags-train.jsonl", val="tags-val.jsonl",
                             extra_model={"num_labels": 2})
        data = ["data.train.text=tokens", "data.train.label=tags", "data.val.text=tokens", "data.val.label=tags"]
    else:
        recipe = text_recipe(text_dir, head, train="lm-train.csv", val="lm-val.csv")
        data = ["+data.train.dynamic_masking=true"]
    env = offline_env(text_dir)
    r = torchrun(2, "train", str(recipe), *data, "trainer.epochs=1", f"run_dir={head}", cwd=text_dir, env=env)
    assert r.returncode == 0, r.output
    run_val = [m for m in metrics(text_dir / head) if m["split"] == "val"][-1]
    one = validate(text_dir, f"{head}/checkpoints/last.pt")["metrics"]
    assert one["loss"] == run_val["loss"] and one["accuracy"] == run_val["accuracy"]
    assert run_val["tokens"] > 0
