"""The recipe composed in a child process while ``mgpu launch`` imports torch's agent in a thread (stdlib only here).

The launcher needs the composed recipe (its run dir, device, threads) to plan the job, and torch's agent to run it.
Composing (Hydra, the schema merge) takes a few tenths of a second and importing the agent (torch) one to several
seconds (the CUDA build of torch takes longest), both before any worker starts. So the launcher composes in a process
of its own, on another core, while a thread of the launcher imports the agent (:class:`Importing`), and its main
thread waits for the composed recipe: the composing is off the time to the first step, and a recipe or an option
the launcher refuses is refused as soon as it is composed and planned, without waiting for torch.

The child (``python -m mgpucli.launch.compose_child RECIPE [overrides]``) writes one JSON object to its stdout: the
composed recipe, or the problems it found (what :func:`mgpucli.config.load_recipe` raised: the launcher raises the
same error). Anything else (a crash, a kill, an unreadable answer) and the launcher composes the recipe itself, as it
would without a child; so a bug in a recipe's composition shows its own traceback, in the launcher.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import signal
import subprocess
import sys
import threading
from typing import Any


class Composing:
    """The child process composing ``recipe`` with ``overrides`` (started at once)."""

    def __init__(self, recipe: str, overrides: list[str]) -> None:
        # -m puts the working directory first on sys.path, as python -m mgpucli has it
        self._recipe = recipe
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, recipe, *overrides],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)

    def result(self) -> Any:
        """The composed recipe (a DictConfig); None when the child gave no answer (compose it here). Raises the
        error the composition raised (a UsageError: the recipe's problems)."""
        from omegaconf import OmegaConf

        from mgpucli.errors import raise_reported

        out, _ = self._proc.communicate()
        try:
            answer = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError, UnicodeDecodeError):
            return None
        if not isinstance(answer, dict):
            return None
        if "recipe" in answer:
            return OmegaConf.create(answer["recipe"])
        raise_reported(answer, self._recipe)
        return None

    def close(self) -> None:
        """End the child if it still runs (the launch failed before it read the result)."""
        if self._proc.returncode is not None:
            return  # its answer was read
        self._proc.kill()
        with contextlib.suppress(OSError, ValueError):
            self._proc.communicate()


class Importing:
    """``module`` imported in a thread of this process (started at once): :meth:`wait` joins it. ``settled`` is set
    when the import ends, or by whoever no longer needs it (a launch refused meanwhile: the thread is a daemon, and the
    process exits without it)."""

    def __init__(self, module: str, settled: threading.Event | None = None) -> None:
        self.settled = settled or threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(module,), name="mgpu-import", daemon=True)
        self._thread.start()

    def _run(self, module: str) -> None:
        try:
            importlib.import_module(module)
        except BaseException as err:  # noqa: BLE001 - raised in the thread that waits for it
            self._error = err
        finally:
            self.settled.set()

    def wait(self) -> bool:
        """Until the module is imported (True), or :attr:`settled` is set first (False); raises what importing it
        raised."""
        self.settled.wait()
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True


def main(argv: list[str]) -> None:
    """The child: compose, then one line of JSON on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the launcher too: end here without a traceback
    from omegaconf import OmegaConf

    from mgpucli.config import load_recipe
    from mgpucli.errors import MgpuError, error_report

    recipe, overrides = argv[0], argv[1:]
    try:
        answer: dict[str, Any] = {"recipe": OmegaConf.to_container(load_recipe(recipe, overrides))}
    except MgpuError as err:
        answer = error_report(err)
    except Exception:  # noqa: BLE001 - a bug: the launcher composes again and shows its traceback (once)
        answer = {}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
