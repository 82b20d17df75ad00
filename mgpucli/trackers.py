"""The experiment trackers a recipe can name in ``trainer.loggers``: which ones exist, what each needs installed, the
mode it runs in here, and the run dir's record of their runs (``trackers.json``).

Stdlib only, and never imports a tracker: the recipe check (exit 2 before any worker starts), the engine's rank 0,
``mgpu doctor`` and ``mgpu doctor RUN_DIR`` all read these facts, and the last two never import torch or a tracker.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import netrc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mgpucli.run_layout import TRACKERS

STATE_FILE = TRACKERS  # in the run dir: each tracker's run id, mode, status and failure
LOGGERS = ("tensorboard", "wandb", "mlflow")  # what trainer.loggers may list; metrics.jsonl is always written
WANDB_MODES = ("auto", "online", "offline")
WANDB_HOST = "https://api.wandb.ai"
# MLflow's own default store is SQLite; mlflow-skinny needs these two for it (its README says so).
MLFLOW_SQL_MODULES = ("sqlalchemy", "alembic")


@dataclass(frozen=True)
class Spec:
    name: str  # as trainer.loggers names it
    title: str  # as users know it
    module: str  # what rank 0 imports
    distributions: tuple[str, ...]  # pip distributions that provide the module (for versions)

    @property
    def pip(self) -> str:
        return f"pip install 'mgpu[{self.name}]'"


SPECS = {
    "wandb": Spec("wandb", "W&B", "wandb", ("wandb",)),
    "mlflow": Spec("mlflow", "MLflow", "mlflow", ("mlflow", "mlflow-skinny")),
}


def enabled(loggers: list[str] | tuple[str, ...], tensorboard: bool | None) -> list[str]:
    """The sinks a run writes to besides metrics.jsonl: ``trainer.loggers`` in order (duplicates dropped), with
    ``trainer.tensorboard`` true or false forcing TensorBoard on or off (null: as the list says)."""
    names = list(dict.fromkeys(str(n) for n in loggers))
    if tensorboard is True and "tensorboard" not in names:
        names.insert(0, "tensorboard")
    elif tensorboard is False and "tensorboard" in names:
        names.remove("tensorboard")
    return names


def trackers_in(loggers: list[str] | tuple[str, ...]) -> list[str]:
    """The trackers (W&B, MLflow) among the sinks."""
    return [name for name in loggers if name in SPECS]


# ------------------------------------------------------------------------------------------------ installed
def module_problem(module: str, importing: bool) -> str | None:
    """Why ``module`` cannot be used here (None: it can). ``importing`` imports it (a broken or shadowed install
    shows only then); otherwise the module is only looked up, which imports nothing."""
    try:
        if importing:
            importlib.import_module(module)
            return None
        if importlib.util.find_spec(module) is not None:
            return None
    except ModuleNotFoundError as err:
        if err.name == module:
            return f"{module} is not installed"
        reason = " ".join(str(err).split())
        return f"{module} does not import (ModuleNotFoundError: {reason})"
    except Exception as err:  # noqa: BLE001 - any failure to import means "not usable here"
        reason = " ".join(str(err).split()) or type(err).__name__
        return f"{module} does not import ({type(err).__name__}: {reason})"
    return f"{module} is not installed"


def version(spec: Spec) -> str | None:
    """The installed version of the tracker's package (from its metadata: nothing is imported)."""
    for dist in spec.distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# ---------------------------------------------------------------------------------------------------- W&B
def wandb_credentials(environ: Mapping[str, str]) -> str | None:
    """Where W&B would find an API key, without asking its server or prompting: ``WANDB_API_KEY``,
    ``WANDB_IDENTITY_TOKEN_FILE``, or the .netrc entry ``wandb login`` writes; None when there is none."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if environ.get(var):
            return var
    path = Path(environ["NETRC"]).expanduser() if environ.get("NETRC") else Path("~/.netrc").expanduser()
    host = urlsplit(environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc
    try:
        found = netrc.netrc(str(path)).authenticators(host) if path.is_file() else None
    except (netrc.NetrcParseError, OSError):
        found = None
    return str(path).replace(os.path.expanduser("~"), "~", 1) if found else None


@dataclass(frozen=True)
class WandbMode:
    mode: str  # online | offline | disabled
    why: str  # for people: what decided it
    asked_online_without_credentials: bool = False


_ENV_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def wandb_mode(requested: str, environ: Mapping[str, str]) -> WandbMode:
    """The mode rank 0 runs W&B in. ``trainer.wandb.mode`` online/offline wins; ``auto`` follows ``WANDB_MODE``
    (``WANDB_DISABLED=true`` too), else online with credentials and offline without. Online without credentials
    would make W&B ask for a key (a prompt that hangs a job, or an error): it runs offline instead."""
    creds = wandb_credentials(environ)
    mode, why = requested, "trainer.wandb.mode"
    if requested == "auto":
        env_mode = _ENV_MODES.get(str(environ.get("WANDB_MODE", "")).strip().lower())
        if str(environ.get("WANDB_DISABLED", "")).strip().lower() in ("true", "1", "yes"):
            mode, why = "disabled", "WANDB_DISABLED"
        elif env_mode is not None:
            mode, why = env_mode, f"WANDB_MODE={environ.get('WANDB_MODE')}"
        elif creds:
            mode, why = "online", f"credentials in {creds}"
        else:
            mode, why = "offline", "no W&B credentials: neither WANDB_API_KEY nor a `wandb login`"
    if mode == "online" and not creds:
        return WandbMode("offline", f"{why} asks for online, but there are no W&B credentials: neither WANDB_API_KEY "
                         "nor a `wandb login`", asked_online_without_credentials=True)
    if mode == "online":
        why = f"{why}; credentials in {creds}" if "credentials" not in why else why
    return WandbMode(mode, why)


def wandb_sync_command(wandb_dir: str | Path, run_id: str) -> str:
    """Uploads every offline part of the run (a resumed run adds a directory with the same id)."""
    return f"wandb sync {Path(wandb_dir) / f'offline-run-*-{run_id}'}"


# ------------------------------------------------------------------------------------------------- MLflow
def mlflow_default_uri(run_dir: str | Path) -> str:
    """MLflow's own kind of default store (SQLite), in the run dir."""
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def mlflow_uri(tracking_uri: str | None, environ: Mapping[str, str], run_dir: str | Path) -> tuple[str, str]:
    """(the tracking URI, what chose it): ``trainer.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a
    SQLite store in the run dir."""
    if tracking_uri:
        return str(tracking_uri), "trainer.mlflow.tracking_uri"
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    return mlflow_default_uri(run_dir), "the default, a SQLite store in the run dir"


def mlflow_needs_sql(uri: str) -> bool:
    return uri.startswith(("sqlite:", "postgresql", "mysql", "mssql"))


# ------------------------------------------------------------------------------------------- trackers.json
def read_state(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The run dir's record of its tracker runs ({} when there is none or it cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def write_state(run_dir: str | Path, state: Mapping[str, Any]) -> None:
    """Replace ``trackers.json`` atomically (a reader never sees half of it)."""
    path = Path(run_dir) / STATE_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
