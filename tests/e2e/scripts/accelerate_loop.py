"""An Accelerate training loop as users write it: a tiny GPT-2 from a config on plain token tensors, ``Accelerator``,
``accelerator.prepare`` of the model, the optimizer and both loaders, ``accelerator.backward``, evaluation with
``gather_for_metrics``. Run under ``mgpu launch --cpu --nproc 2`` with ``ACCELERATE_USE_CPU=true`` (Accelerate joins
torchrun's job on CPUs only with it).

``--find-unused true|false`` passes ``DistributedDataParallelKwargs(find_unused_parameters=...)``; by default the
Accelerator gets no handler (Accelerate's default: False). ``--extra-head`` adds a head the loss never uses;
``--dispatch-batches`` has rank 0 read the batches and send each rank its part; ``--leave-out model|train_loader``
leaves that out of ``accelerator.prepare`` (the mistake); ``--save-state`` saves with ``accelerator.save_state``,
``--torch-save`` with ``torch.save`` on every rank (the mistake)."""

import argparse

import torch
from accelerate import Accelerator, DataLoaderConfiguration, DistributedDataParallelKwargs
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoConfig, AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--find-unused", choices=["default", "true", "false"], default="default")
parser.add_argument("--extra-head", action="store_true")
parser.add_argument("--leave-out", choices=["model", "train_loader"], help="the mistake: not passed to prepare")
parser.add_argument("--dispatch-batches", action="store_true", help="rank 0 reads every batch and sends each its part")
parser.add_argument("--save-state", action="store_true", help="accelerator.save_state at the end")
parser.add_argument("--torch-save", action="store_true", help="the mistake: torch.save on every rank at the end")
parser.add_argument("--epochs", type=int, default=2)
cli = parser.parse_args()


class WithExtraHead(torch.nn.Module):
    """A causal LM and a second head for a task this loop never trains: its parameters get no gradient."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.value_head = torch.nn.Linear(lm.config.n_embd, 1)

    def forward(self, **batch):
        return self.lm(**batch)


handlers = [] if cli.find_unused == "default" else [
    DistributedDataParallelKwargs(find_unused_parameters=cli.find_unused == "true")]
accelerator = Accelerator(kwargs_handlers=handlers,
                          dataloader_config=DataLoaderConfiguration(dispatch_batches=cli.dispatch_batches or None))
torch.manual_seed(0)
config = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32)
model = AutoModelForCausalLM.from_config(config)
if cli.extra_head:
    model = WithExtraHead(model)
tokens = torch.randint(0, 64, (81, 16))
train_loader = DataLoader(TensorDataset(tokens[:64]), batch_size=8, shuffle=True)
eval_loader = DataLoader(TensorDataset(tokens[64:]), batch_size=8)  # 17: one rank gets a sample more
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if cli.leave_out == "model":
    optimizer, train_loader, eval_loader = accelerator.prepare(optimizer, train_loader, eval_loader)
elif cli.leave_out == "train_loader":
    model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)
else:
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
for epoch in range(cli.epochs):
    model.train()
    for (ids,) in train_loader:
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    losses = []
    with torch.no_grad():
        for (ids,) in eval_loader:
            losses.append(accelerator.gather_for_metrics(model(input_ids=ids, labels=ids).loss.repeat(len(ids))))
    accelerator.print(f"epoch {epoch} eval loss {torch.cat(losses).mean():.4f} over {len(torch.cat(losses))}")
accelerator.wait_for_everyone()
if cli.save_state:
    accelerator.save_state("accelerate_state")
if cli.torch_save:
    torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
accelerator.end_training()
