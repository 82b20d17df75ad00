"""The experiment trackers a recipe can name in ``trainer.loggers``: the registry every other part reads.

A tracker is one entry here (:class:`Spec`, added with :func:`register`) plus the module its runs go through on
rank 0 (``Spec.sink``, e.g. :mod:`mgpucli.engine.tracking.wandb_sink`). The entry declares what the rest needs:
its extra and the module it needs installed, its ``trainer.<name>`` options (the schema), what ``mgpu doctor``
shows, the recipe check's own problems, how the post-mortem says where its run is, and whether mgpu picks its run
id before it starts (so a resumed run continues it). The schema, the recipe check, the doctor, the post-mortem and
the engine read this registry and never a tracker's name. Also here: the mode each runs in, and the run dir's record
of their runs (``trackers.json``).

Stdlib only. A tracker is imported only when asked (:func:`module_problem` with ``importing=True``: the launcher's
and ``--check``'s recipe check); ``mgpu doctor`` and ``mgpu doctor RUN_DIR`` read these facts without importing
torch or a tracker.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import netrc
import os
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from mgpucli.run_layout import MLFLOW_DB, TRACKERS

STATE_FILE = TRACKERS  # in the run dir: each tracker's run id, mode, status and failure
TENSORBOARD = "tensorboard"  # the one logger that is no tracker (RUN_DIR/tensorboard, written without importing it)
WANDB_MODES = ("auto", "online", "offline")
WANDB_HOST = "https://api.wandb.ai"
# MLflow's own default store is SQLite; mlflow-skinny needs these two for it (its README says so).
MLFLOW_SQL_MODULES = ("sqlalchemy", "alembic")


@dataclass(frozen=True)
class Observed:
    """A tracker as a run started from this shell would use it (``mgpu doctor``; nothing imported, no server)."""

    mode: str  # W&B: online, offline or disabled; MLflow: the tracking URI
    why: str  # what decided the mode
    problem: str = ""  # why it would not run as asked (W&B online without credentials, a missing module)


@dataclass(frozen=True)
class Spec:
    """One experiment tracker, as the rest of mgpu needs to know it."""

    name: str  # as trainer.loggers names it; also its pip extra (mgpu[name]) and its trainer.<name> options
    title: str  # as users know it
    module: str  # what rank 0 imports
    distributions: tuple[str, ...]  # pip distributions that provide the module (for versions)
    sink: str  # the module whose make() gives rank 0's sink (mgpucli.engine.tracking.Sink)
    options: type  # the dataclass of its trainer.<name> options (mgpucli.config.schema)
    observe: Callable[[Mapping[str, str]], Observed]  # mgpu doctor: its mode here, from the environment alone
    shows: Callable[[Observed], str]  # mgpu doctor's line for it when it is fine
    fix: str  # mgpu doctor's hint when observe found a problem
    where: tuple[str, ...] = ()  # its trackers.json keys that say where its run is, first found shown (post-mortem)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # option -> allowed values (the schema)
    # the recipe check's own problems: (its options, the run dir, the environment, importing) -> lines
    check: Callable[[Mapping[str, Any], str, Mapping[str, str], bool], list[str]] | None = None
    new_run_id: Callable[[], str] | None = None  # mgpu picks the run id before the run starts (None: the tracker)

    @property
    def pip(self) -> str:
        return f"pip install 'mgpu[{self.name}]'"


SPECS: dict[str, Spec] = {}


def register(spec: Spec) -> Spec:
    """Add (or replace) a tracker: ``trainer.loggers`` may name it from then on."""
    SPECS[spec.name] = spec
    return spec


def loggers() -> tuple[str, ...]:
    """What trainer.loggers may list; metrics.jsonl is always written."""
    return (TENSORBOARD, *SPECS)


def enabled(loggers: list[str] | tuple[str, ...], tensorboard: bool | None) -> list[str]:
    """The sinks a run writes to besides metrics.jsonl: ``trainer.loggers`` in order (duplicates dropped), with
    ``trainer.tensorboard`` true or false forcing TensorBoard on or off (null: as the list says)."""
    names = list(dict.fromkeys(str(n) for n in loggers))
    if tensorboard is True and TENSORBOARD not in names:
        names.insert(0, TENSORBOARD)
    elif tensorboard is False and TENSORBOARD in names:
        names.remove(TENSORBOARD)
    return names


def trackers_in(names: list[str] | tuple[str, ...]) -> list[str]:
    """The trackers (W&B, MLflow...) among the sinks."""
    return [name for name in names if name in SPECS]


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


def new_wandb_id() -> str:
    """A W&B run id chosen by mgpu (W&B's own form: 8 lowercase letters and digits), so that it is known, and goes
    into checkpoints, before the tracker has started."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


@dataclass
class WandbOptions:
    project: Optional[str] = None  # default: the recipe's name
    entity: Optional[str] = None  # default: your W&B default entity
    name: Optional[str] = None  # the run's display name; default: the run dir's name
    tags: list[str] = field(default_factory=list)  # added to mgpu's own (world size, device, versions)
    mode: str = "auto"  # auto: WANDB_MODE if set, else online with credentials and offline without


def _observe_wandb(environ: Mapping[str, str]) -> Observed:
    mode = wandb_mode("auto", environ)
    return Observed(mode.mode, mode.why, f"{mode.why}: runs log offline instead"
                    if mode.asked_online_without_credentials else "")


register(Spec(
    "wandb", "W&B", "wandb", ("wandb",), sink="mgpucli.engine.tracking.wandb_sink", options=WandbOptions,
    observe=_observe_wandb,
    shows=lambda o: f"runs log {o.mode} ({o.why})" + ("; upload them with `wandb sync`" if o.mode == "offline" else ""),
    fix="Log in once with `wandb login` (or export WANDB_API_KEY); upload offline runs with `wandb sync`.",
    where=("sync", "url"), choices={"mode": WANDB_MODES}, new_run_id=new_wandb_id,
))


# ------------------------------------------------------------------------------------------------- MLflow
def mlflow_default_uri(run_dir: str | Path) -> str:
    """MLflow's own kind of default store (SQLite), in the run dir."""
    return f"sqlite:///{Path(run_dir).resolve() / MLFLOW_DB}"


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


@dataclass
class MLflowOptions:
    tracking_uri: Optional[str] = None  # default: MLFLOW_TRACKING_URI, else sqlite:///RUN_DIR/mlflow.db
    experiment: Optional[str] = None  # default: the recipe's name
    run_name: Optional[str] = None  # default: the run dir's name


def _observe_mlflow(environ: Mapping[str, str]) -> Observed:
    uri, why = mlflow_uri(None, environ, "RUN_DIR")
    if why.startswith("the default"):
        uri, why = f"sqlite:///RUN_DIR/{MLFLOW_DB}", "the default, a SQLite store in each run dir"
    missing = [m for m in MLFLOW_SQL_MODULES if module_problem(m, importing=False)]
    return Observed(uri, why, f"{uri} needs {' and '.join(missing)}, which mlflow-skinny leaves out"
                    if missing and mlflow_needs_sql(uri) else "")


def _check_mlflow(options: Mapping[str, Any], run_dir: str, environ: Mapping[str, str], importing: bool) -> list[str]:
    """Its store's SQL modules, which mlflow-skinny leaves out."""
    uri, chosen_by = mlflow_uri(options.get("tracking_uri"), environ, run_dir)
    missing = [m for m in MLFLOW_SQL_MODULES if module_problem(m, importing)] if mlflow_needs_sql(uri) else []
    if not missing:
        return []
    return [f"mlflow: its store {uri} ({chosen_by}) needs {' and '.join(missing)}, which mlflow-skinny leaves out; "
            "install them with pip install 'mgpu[mlflow]', or set trainer.mlflow.tracking_uri (or "
            "MLFLOW_TRACKING_URI) to an MLflow server"]


register(Spec(
    "mlflow", "MLflow", "mlflow", ("mlflow", "mlflow-skinny"), sink="mgpucli.engine.tracking.mlflow_sink",
    options=MLflowOptions, observe=_observe_mlflow, shows=lambda o: f"runs go to {o.mode} ({o.why})",
    fix="pip install 'mgpu[mlflow]' (or export MLFLOW_TRACKING_URI=http://your-server:5000)",
    where=("tracking_uri",), check=_check_mlflow,
))


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
