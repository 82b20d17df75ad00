"""A Transformers ``Trainer`` script as users write it: a tiny BERT for sequence classification from a config, a
word-level tokenizer built from the texts (nothing from the Hub), ``DataCollatorWithPadding``, train then evaluate
(17 samples: one rank gets one more). Run under ``mgpu launch --cpu --nproc 2`` (torchrun's environment: the Trainer
joins the job itself).

``--find-unused true|false`` passes ``ddp_find_unused_parameters``; by default the Trainer's own default applies
(``find_unused_parameters=True`` for a model without gradient checkpointing). ``--head cls`` trains the user's own
classifier on the [CLS] token's hidden state over ``AutoModel`` (whose pooler, built by default, is then never used).
``--save`` saves a checkpoint every epoch; ``--use-cpu false`` leaves out ``use_cpu=True`` (the mistake)."""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

parser = argparse.ArgumentParser()
parser.add_argument("--find-unused", choices=["default", "true", "false"], default="default")
parser.add_argument("--head", choices=["auto", "cls"], default="auto")
parser.add_argument("--save", action="store_true")
parser.add_argument("--use-cpu", choices=["true", "false"], default="true")
parser.add_argument("--epochs", type=int, default=2)
cli = parser.parse_args()

words = ["good", "bad", "great", "awful", "fine", "poor", "nice", "sad", "the", "movie", "was", "very", "not"]
texts, labels = [], []
g = torch.Generator().manual_seed(0)
for _ in range(65):
    n = int(torch.randint(3, 9, (1,), generator=g))
    picked = [words[int(j)] for j in torch.randint(0, len(words), (n,), generator=g)]
    texts.append(" ".join(picked))
    labels.append(int(sum(w in ("good", "great", "fine", "nice") for w in picked) > 1))

vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
backend.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


class ClsHead(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.bert = AutoModel.from_config(config)
        self.classifier = torch.nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.classifier(self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0])
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class TextSet(torch.utils.data.Dataset):
    def __init__(self, texts, labels):
        self.items = [{**tokenizer(t), "labels": y} for t, y in zip(texts, labels, strict=True)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


config = AutoConfig.for_model("bert", vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = AutoModelForSequenceClassification.from_config(config) if cli.head == "auto" else ClsHead(config)
find_unused = {"default": None, "true": True, "false": False}[cli.find_unused]
args = TrainingArguments(
    output_dir="hf_out",
    per_device_train_batch_size=8,
    per_device_eval_batch_size=8,
    num_train_epochs=cli.epochs,
    learning_rate=1e-3,
    report_to=[],
    save_strategy="epoch" if cli.save else "no",
    logging_strategy="no",
    use_cpu=cli.use_cpu == "true",  # on CPU workers, the Trainer joins torchrun's job only with it
    ddp_find_unused_parameters=find_unused,
)
trainer = Trainer(model=model, args=args, train_dataset=TextSet(texts[:48], labels[:48]),
                  eval_dataset=TextSet(texts[48:], labels[48:]), data_collator=DataCollatorWithPadding(tokenizer))
trainer.train()
metrics = trainer.evaluate()
if trainer.is_world_process_zero():
    print(f"eval_loss {metrics['eval_loss']:.4f} world {trainer.args.world_size}", flush=True)
