"""``mgpu validate CHECKPOINT``: evaluate a saved checkpoint exactly, safely, on 1 or N processes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

from mgpucli.errors import MgpuError
from mgpucli.run_layout import LAST_SHARDED


def validate(
    checkpoint: str = typer.Argument(
        ..., help=f"An mgpu checkpoint (a file, or a sharded one's directory such as {LAST_SHARDED}), or a plain "
                  "state_dict with --recipe."),
    overrides: list[str] | None = typer.Argument(
        None, help="Recipe overrides, e.g. data.batch_size=256 or data.val.num_samples=500.", show_default=False
    ),
    recipe: str | None = typer.Option(
        None, "--recipe", metavar="RECIPE", help="Use this recipe instead of the checkpoint's own."
    ),
    split: str = typer.Option("val", "--split", metavar="val|train", help="Which dataset to evaluate: val or train."),
    weights: str = typer.Option(
        "model", "--weights", metavar="model|ema",
        help="The model's weights, or their moving average (checkpoints of runs with trainer.ema)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (and nothing else there)."),
    gpus: str | None = typer.Option(
        None, "--gpus", metavar="N|LIST|all", help="GPUs to evaluate on: N, 0,2,3, or all."
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Evaluate on CPU processes (gloo)."),
    nproc: int | None = typer.Option(None, "--nproc", metavar="N", help="Number of CPU processes (with --cpu)."),
    trust_recipe: bool = typer.Option(
        False, "--trust-recipe", help="Allow _target_s outside mgpu's allowlist in the checkpoint's recipe."
    ),
    result_file: str | None = typer.Option(None, "--result-file", hidden=True),
) -> None:
    """Evaluate a checkpoint: every sample counted once, identical metrics on 1 or N processes."""
    from mgpucli.console import print_error
    from mgpucli.distributed.env import read_rank_env

    rank = None
    try:
        from mgpucli.errors import UsageError

        if split not in ("val", "train"):
            raise UsageError(f"--split {split!r}: choose val or train.")
        if weights not in ("model", "ema"):
            raise UsageError(f"--weights {weights!r}: choose model (the model's own) or ema (their moving average).")
        env = read_rank_env()
        rank = env.rank if env.distributed else None
        args = dict(overrides=list(overrides or []), recipe=recipe, split=split, trust_recipe=trust_recipe,
                    weights=weights)
        if env.distributed:  # a worker started by the parent below (or by the user's own torchrun)
            from mgpucli.distributed.runtime import exit_after_teardown

            result = _worker(checkpoint, env, cpu, **args)
            if result_file and env.rank == 0:
                Path(result_file).write_text(json.dumps(result))
            if not result_file:
                _render(result, as_json)
            exit_after_teardown(0)
        else:
            result = _parent(checkpoint, gpus, cpu, nproc, **args)
        _render(result, as_json)
    except MgpuError as err:
        if rank in (None, 0) or not err.same_on_every_rank:
            print_error(str(err), rank=rank)
        sys.exit(err.exit_code)


def _worker(checkpoint: str, env, cpu: bool, **args: Any) -> dict[str, Any]:
    from mgpucli.engine.validate_checkpoint import run_validation

    return run_validation(checkpoint, args["overrides"], recipe=args["recipe"], split=args["split"],
                          trust_recipe=args["trust_recipe"], env=env, prefer_cpu=cpu, weights=args["weights"])


def _parent(checkpoint: str, gpus: str | None, cpu: bool, nproc: int | None, **args: Any) -> dict[str, Any]:
    """One process: evaluate here. Several: check everything here first, then start workers."""
    from mgpucli.distributed.env import RankEnv
    from mgpucli.errors import JobFailed

    overrides = args["overrides"] + (["trainer.device=cpu"] if cpu else [])
    args = {**args, "overrides": overrides}
    if gpus is None and (nproc is None or (cpu and nproc == 1)):  # else select_devices checks the options
        return _worker(checkpoint, RankEnv(), cpu, **args)
    import torch

    from mgpucli.distributed.select import select_devices
    from mgpucli.engine.validate_checkpoint import read_checkpoint, resolve_recipe
    from mgpucli.launch.spawn import run_workers

    selection = select_devices(gpus, cpu, nproc, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    # bad input fails here, before any process
    _, info = read_checkpoint(checkpoint, args["weights"])
    resolve_recipe(info, checkpoint, overrides, args["recipe"], args["trust_recipe"])
    with tempfile.TemporaryDirectory(prefix="mgpu-validate-") as tmp:
        out = Path(tmp) / "result.json"
        worker_args = ["validate", checkpoint, *overrides, "--split", args["split"], "--weights", args["weights"],
                       "--result-file", str(out)]
        if args["recipe"]:
            worker_args += ["--recipe", args["recipe"]]
        if args["trust_recipe"]:
            worker_args.append("--trust-recipe")
        if cpu:
            worker_args.append("--cpu")
        code = run_workers(worker_args, selection)
        if code != 0 or not out.exists():
            raise JobFailed(f"validation on {selection.nproc} processes failed (exit code {code}); "
                            "the workers' errors are above.")
        return json.loads(out.read_text())


def _render(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    from rich.table import Table

    from mgpucli.console import err_console

    ck = result["checkpoint"]
    mid = ", mid-epoch" if ck.get("mid_epoch") else ""
    where = f"epoch {ck['epoch']}{mid}, step {ck['step']}" if ck.get("step") is not None else "plain state_dict"
    where += ", EMA weights" if ck.get("weights") == "ema" else ""
    table = Table(title=f"{ck['path']} ({where}) - {result['split']} split, {result['samples']} samples, "
                        f"{result['processes']} process(es) on {result['device']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result["metrics"].items():
        table.add_row(name, f"{value:.6g}")
    err_console().print(table)
