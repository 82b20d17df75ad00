"""The hand-written DDP loop that benchmarks/overhead.py holds mgpu against.

Written the way the PyTorch tutorials teach it: ``init_process_group``, ``DistributedSampler`` + ``set_epoch``,
``DistributedDataParallel`` with its defaults, the optimizer, ``loss.backward()``. It trains the workloads of
mgpu's shipped recipes (recipes/quickstart.yaml, recipes/charlm.yaml, recipes/text-classification.yaml) with the
same model classes, seed, data order and hyperparameters, so that its final weights can be compared bit for bit
with mgpu's. The text workload is the Hugging Face way: a ``datasets.Dataset`` tokenized with ``map``,
``DataCollatorWithPadding``, and the model's own loss from ``model(**batch)``. Rank 0 logs the
loss and the time every ``log_every`` steps and at the end of each epoch to ``<out>/metrics.jsonl`` (the steps
mgpu logs at), and saves the final weights to ``<out>/weights.pt``.

    torchrun --standalone --nproc-per-node 2 benchmarks/handwritten.py --workload mlp --out /tmp/hw
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from mgpucli.components.datasets import CharText, SyntheticClassification
from mgpucli.components.models import MLP, CharTransformer

# The recipes' values, hard-coded as a user would (overhead.py checks them against the YAML files).
WORKLOADS = {
    "mlp": {"recipe": "quickstart", "seed": 0, "batch_size": 32, "epochs": 3, "lr": 0.05, "momentum": 0.9,
            "clip_grad_norm": None, "log_every": 20},
    "charlm": {"recipe": "charlm", "seed": 0, "batch_size": 16, "epochs": 2, "lr": 0.002, "weight_decay": 0.01,
               "block_size": 64, "clip_grad_norm": 1.0, "log_every": 20},
    "text": {"recipe": "text-classification", "seed": 0, "batch_size": 32, "epochs": 8, "lr": 0.002,
             "weight_decay": 0.01, "max_length": 96, "clip_grad_norm": None, "log_every": 10},
}
BERT = {"vocab_size": 384, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 128, "num_labels": 2}


def build(workload: str):
    """The training set, model, the loss of one batch, and the loader's collate function of one workload (the
    dataset first, then the model, as mgpu does)."""
    w = WORKLOADS[workload]
    if workload == "mlp":
        train_set = SyntheticClassification(num_samples=4096, num_features=32, num_classes=4, seed=w["seed"],
                                            split="train")
        model = MLP(in_features=32, out_features=4, hidden=[64, 64])
        return train_set, model, lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]), None
    if workload == "text":
        return build_text(w)
    train_set = CharText(split="train", block_size=w["block_size"])
    model = CharTransformer(vocab_size=96, block_size=w["block_size"], d_model=128, n_head=4, n_layer=2)

    def loss(m, batch):
        out = m(batch[0])
        return F.cross_entropy(out.view(-1, out.size(-1)), batch[1].view(-1))

    return train_set, model, loss, None


def build_text(w):
    """Generated reviews tokenized by a byte-level tokenizer, a tiny BERT from its config: the Hugging Face way."""
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForSequenceClassification, ByT5Tokenizer, DataCollatorWithPadding

    from mgpucli.components.text import review_rows

    tokenizer = ByT5Tokenizer()
    rows = Dataset.from_list(review_rows(num_samples=2048, split="train"))
    train_set = rows.map(lambda b: {**tokenizer(b["text"], truncation=True, max_length=w["max_length"]),
                                    "labels": b["label"]}, batched=True, remove_columns=rows.column_names)
    config = AutoConfig.for_model("bert", **BERT)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    collate = DataCollatorWithPadding(tokenizer)
    return train_set, model, lambda m, batch: m(**batch).loss, lambda rows: dict(collate(rows))


def to_device(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    return [t.to(device) for t in batch]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    p.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", required=True, help="folder for metrics.jsonl and weights.pt")
    args = p.parse_args()
    w = WORKLOADS[args.workload]
    epochs = args.epochs or w["epochs"]

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(w["seed"])
    train_set, model, loss_fn, collate = build(args.workload)
    sampler = DistributedSampler(train_set, seed=w["seed"])
    loader = DataLoader(train_set, batch_size=w["batch_size"], sampler=sampler, pin_memory=args.device == "cuda",
                        collate_fn=collate)
    model = DDP(model.to(device), device_ids=[local_rank] if args.device == "cuda" else None)
    if args.workload == "mlp":
        optimizer = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=w["momentum"])
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=w["lr"], weight_decay=w["weight_decay"])
    scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))
                 if args.workload != "charlm" else None)
    torch.manual_seed(w["seed"] + 1000 * rank)  # a seed offset per rank (dropout differs per rank), as mgpu does

    log = open(os.path.join(args.out, "metrics.jsonl"), "w") if rank == 0 else None  # noqa: SIM115
    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, batch in enumerate(loader):
            loss = loss_fn(model, to_device(batch, device))
            optimizer.zero_grad()
            loss.backward()
            if w["clip_grad_norm"] is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), w["clip_grad_norm"])
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            step += 1
            if log and (step % w["log_every"] == 0 or i == len(loader) - 1):
                record = {"split": "train", "step": step, "epoch": epoch + 1, "loss": loss.item(), "time": time.time()}
                log.write(json.dumps(record) + "\n")

    if log:
        log.close()
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
    dist.barrier()  # gloo can abort at exit when one rank tears down while the other still saves
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
