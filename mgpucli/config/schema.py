"""The typed schema of a recipe's non-component sections (OmegaConf structured configs).

Components (``model``, ``optim``, ``scheduler``, ``data.train``, ``data.val``, a custom ``task``) are free-form
``_target_`` nodes typed ``Any``: their arguments are checked against the target's signature instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional

from omegaconf import MISSING

from mgpucli import trackers

# Choices are validated by mgpu (with a message that lists them) rather than by Enum types.
CHOICES: dict[str, tuple[str, ...]] = {
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.strategy": ("auto", "single", "ddp", "dp", "fsdp"),
    "trainer.checkpoint_format": ("auto", "full", "sharded"),
    "trainer.precision": ("fp32", "bf16", "fp16"),
    "trainer.scheduler_interval": ("step", "epoch"),
    "trainer.best_mode": ("auto", "min", "max"),
}  # and each tracker's own (mgpucli.trackers: Spec.choices), see choices()
# The validation metrics each built-in task reports (the engine's tasks; a unit test keeps the two in step), for
# checking names such as trainer.early_stopping.metric before anything is built.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("loss", "accuracy"),
    "regression": ("loss", "mse", "mae"),
    "language_model": ("loss", "perplexity"),
    # Hugging Face Transformers' heads: dict batches, the model's own loss
    "sequence_classification": ("loss", "accuracy", "f1"),
    "token_classification": ("loss", "accuracy"),
    "causal_lm": ("loss", "perplexity", "accuracy"),
    "masked_lm": ("loss", "perplexity", "accuracy"),
}
BUILTIN_TASKS = tuple(TASK_METRICS)


@dataclass
class DDPOptions:
    find_unused_parameters: bool = False
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    broadcast_buffers: bool = True


@dataclass
class FSDPOptions:
    wrap: Optional[list[str]] = None  # module class names to shard; default: the blocks of any nn.ModuleList
    reshard_after_forward: bool = True
    activation_checkpointing: bool = False  # recompute each wrapped block's activations in backward
    cpu_offload: bool = False  # parameters and optimizer state in CPU memory (needs CUDA GPUs)


@dataclass
class EMAOptions:
    """``trainer.ema``: an exponential moving average of the weights, kept on every rank (off when absent)."""

    decay: float = 0.999  # ema = decay * ema + (1 - decay) * weights, after an optimizer step
    every: int = 1  # optimizer steps between updates
    start_step: int = 0  # until this step the EMA weights are the model's; the average starts after it
    validate: bool = False  # validate the EMA weights instead of the model's (best.pt, early stopping follow)


@dataclass
class EarlyStoppingOptions:
    """``trainer.early_stopping``: stop when a validation metric stops improving (off when absent)."""

    metric: str = "loss"  # a validation metric of the task
    mode: str = "auto"  # auto: min for loss-like names, max otherwise
    patience: int = 3  # validations in a row without improvement before the run stops
    min_delta: float = 0.0  # an improvement must exceed this


@dataclass
class ProfileOptions:
    """``trainer.profile``: a torch.profiler trace of a few steps on every rank (off when absent)."""

    start_step: int = 10  # the first optimizer step traced (steps are numbered from 1, as in metrics.jsonl)
    steps: int = 5


@dataclass
class TrainerSchema:
    epochs: int = 1
    max_steps: Optional[int] = None  # stop after this many optimizer steps (overrides epochs when reached)
    device: str = "auto"
    strategy: str = "auto"
    cpu_threads: Optional[int] = None  # intra-op threads per CPU worker (default: cores / local processes)
    grad_accum: int = 1
    clip_grad_norm: Optional[float] = None
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    sync_batchnorm: bool = False
    ddp: DDPOptions = field(default_factory=DDPOptions)
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)
    # recompute blocks' activations in backward: true (the blocks of any nn.ModuleList; fsdp.wrap's under fsdp) or
    # a list of module class names; any strategy
    activation_checkpointing: Any = False
    ema: Optional[EMAOptions] = None
    early_stopping: Optional[EarlyStoppingOptions] = None
    profile: Optional[ProfileOptions] = None
    # full: one file gathered on rank 0; sharded: a torch.distributed.checkpoint directory, each rank writing its
    # part; auto: sharded under FSDP, full otherwise (a resumed run keeps its checkpoint's format)
    checkpoint_format: str = "auto"
    # sharded checkpoints written in the background (torch.distributed.checkpoint's async save) while training goes on
    async_save: bool = False
    scheduler_interval: str = "step"
    log_every: int = 10  # optimizer steps per train-metrics record (and per metrics all-reduce)
    # each rank's step time by phase in every train record, the straggler named. Off until its cost is shown under
    # 1% of a step on the shipped recipes (benchmarks/README.md); the probe measures it whatever this says.
    anatomy: bool = False
    val_every: int = 1  # epochs between validations (0: never)
    checkpoint_every: int = 1  # epochs between last.pt writes (0: only at the end)
    checkpoint_every_steps: Optional[int] = None
    keep_checkpoints: int = 0  # numbered copies to keep beside last.pt
    best_metric: Optional[str] = None  # e.g. "accuracy" (a validation metric) for best.pt
    best_mode: str = "auto"  # auto: min for loss-like names, max otherwise
    timeout_s: int = 600  # collective timeout
    stall_s: Optional[int] = None  # stop a job whose rank makes no progress this long (None: the default; 0: never)
    progress: bool = True
    # Where rank 0 sends every record besides metrics.jsonl (always written): tensorboard (RUN_DIR/tensorboard
    # scalar events, written without importing TensorBoard) and the experiment trackers of mgpucli.trackers, whose
    # options (trainer.<name>) recipe_schema() adds.
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    tensorboard: Optional[bool] = None  # true/false: TensorBoard on/off whatever loggers says; null: as it says


@dataclass
class DataSchema:
    train: Any = MISSING
    val: Any = None
    batch_size: int = MISSING  # per process
    val_batch_size: Optional[int] = None  # default: batch_size
    num_workers: Any = "auto"  # int or "auto"
    shuffle: bool = True
    drop_last: bool = False
    pin_memory: Any = "auto"  # bool or "auto" (on for CUDA)


@dataclass
class RecipeSchema:
    name: str = MISSING
    description: Optional[str] = None
    requires: Any = None  # list of extras/packages the recipe needs (informational)
    vars: Any = None  # free-form values for interpolation, e.g. ${vars.block_size}
    seed: int = 0
    run_dir: str = "runs/${name}"
    model: Any = MISSING
    data: DataSchema = field(default_factory=DataSchema)
    task: Any = "classification"
    optim: Any = MISSING
    scheduler: Any = None
    trainer: TrainerSchema = field(default_factory=TrainerSchema)


# Sections whose contents are components (free-form, checked against signatures, not the schema).
COMPONENT_PATHS = ("model", "optim", "scheduler", "data.train", "data.val", "task", "requires", "vars")


def choices() -> dict[str, tuple[str, ...]]:
    """Every key with a fixed set of values: :data:`CHOICES` and each registered tracker's."""
    extra = {f"trainer.{spec.name}.{key}": tuple(values) for spec in trackers.SPECS.values()
             for key, values in spec.choices.items()}
    return {**CHOICES, **extra}


def recipe_schema() -> type:
    """:class:`RecipeSchema` with each registered tracker's options as ``trainer.<name>`` (mgpucli.trackers)."""
    return _recipe_schema(tuple((spec.name, spec.options) for spec in trackers.SPECS.values()))


@functools.lru_cache(maxsize=4)
def _recipe_schema(options: tuple[tuple[str, type], ...]) -> type:
    trainer = make_dataclass("TrainerSchema", [(name, kind, field(default_factory=kind)) for name, kind in options],
                             bases=(TrainerSchema,))
    return make_dataclass("RecipeSchema", [("trainer", trainer, field(default_factory=trainer))],
                          bases=(RecipeSchema,))
