"""The trials of a sweep: overrides in Hydra's sweep syntax expanded into every combination (hydra-core).

``optim.lr=0.1,0.01 trainer.epochs=range(1,3) data.batch_size=32`` is 4 trials: the two sweeps' grid (the first key
varying slowest, as Hydra's own basic sweeper orders it), ``data.batch_size=32`` applied to each. The values are
Hydra's: a comma list, ``range(...)``, ``choice(...)``, ``glob(...)``; an ``interval(...)`` has no grid (it is for a
search). Hydra's override parser reads them exactly as ``python app.py -m`` would.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from mgpucli.errors import UsageError

_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")  # what a trial's directory name keeps of a value


@dataclass(frozen=True)
class Axis:
    """One swept key and its values, as overrides write them (``optim.lr``, ``["0.1", "0.01"]``)."""

    key: str  # the key as the override writes it, with its prefix: ``optim.lr``, ``+model.dropout``
    values: tuple[str, ...]

    @property
    def path(self) -> str:
        return self.key.lstrip("+~")


@dataclass(frozen=True)
class Trial:
    """One combination: its index in the grid, its values, and the name its run dir takes."""

    index: int
    values: tuple[tuple[str, str], ...]  # (key, value) per axis, in the axes' order
    name: str

    @property
    def overrides(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.values]

    def describe(self) -> str:
        """``optim.lr=0.1 trainer.epochs=2``: the trial's values as a person reads them."""
        return " ".join(self.overrides)


@dataclass(frozen=True)
class Grid:
    """The sweep's overrides: those every trial gets, the axes, and the trials."""

    common: tuple[str, ...]
    axes: tuple[Axis, ...]
    trials: tuple[Trial, ...]


def parsed(overrides: list[str]) -> list[tuple[str, object]]:
    """Each override with Hydra's reading of it (``hydra.core.override_parser``'s ``Override``); UsageError (exit 2)
    for one Hydra cannot read and for one that names the run dir (the sweep gives each trial its own)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    found = []
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as err:
            raise UsageError(f"{line}: not an override Hydra can read ({_first_line(err)}).",
                             "Sweep a key with key=a,b,c, key=range(1,4) or key=choice(a,b); set one with key=value."
                             ) from None
        if override.get_key_element().lstrip("+~") == "run_dir":
            raise UsageError(f"{line}: a sweep gives each trial its own run dir, under runs/NAME/.",
                             "Drop run_dir; --name NAME names the sweep's directory.")
        found.append((line, override))
    return found


def expand(overrides: list[str]) -> Grid:
    """The grid the overrides describe; UsageError (exit 2) for an override :func:`parsed` refuses, and for a sweep
    with nothing swept or an interval in it."""
    common: list[str] = []
    axes: list[Axis] = []
    for line, override in parsed(overrides):
        key = override.get_key_element()
        if not override.is_sweep_override():
            common.append(line)
        elif override.is_interval_sweep():
            raise UsageError(f"{line}: an interval has no grid of values to run.",
                             f"Give the values ({key}=0.1,0.01,0.001 or {key}=range(...)), or search the interval: "
                             "--search optuna --trials N.")
        else:
            axes.append(Axis(key, tuple(override.sweep_string_iterator())))
    if not axes:
        raise UsageError("Nothing to sweep: no override has several values.",
                         "Give a key several values: optim.lr=0.1,0.01,0.001 (or range(...), choice(...)).")
    return Grid(tuple(common), tuple(axes), _trials(axes))


def trial_name(index: int, width: int, labels: list[str], values: list[str]) -> str:
    """``03-lr=0.1-hidden=128_128``: the trial's index (``width`` digits) and its values as a directory keeps them."""
    return f"{index:0{width}d}-" + "-".join(f"{label}={_safe(value)}" for label, value in zip(labels, values,
                                                                                              strict=True))


def _trials(axes: list[Axis]) -> tuple[Trial, ...]:
    labels = _labels(axes)
    combos = list(itertools.product(*(axis.values for axis in axes)))
    width = len(str(len(combos) - 1))
    return tuple(Trial(i, tuple((axis.key, value) for axis, value in zip(axes, combo, strict=True)),
                       trial_name(i, width, labels, list(combo)))
                 for i, combo in enumerate(combos))


def labels_of(keys: list[str]) -> list[str]:
    """Each key's label in trial names: its last part (``lr``), or the whole key where two keys share one."""
    paths = [key.lstrip("+~") for key in keys]
    last = [path.rsplit(".", 1)[-1] for path in paths]
    return [part if last.count(part) == 1 else path for path, part in zip(paths, last, strict=True)]


def _labels(axes: list[Axis]) -> list[str]:
    return labels_of([axis.key for axis in axes])


def _safe(value: str) -> str:
    """A value as a directory name keeps it: ``[128,128]`` -> ``128_128``."""
    return _SAFE.sub("_", value).strip("_") or "_"


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
