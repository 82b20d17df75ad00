"""DDP's unused parameters: ``find_unused_parameters=True`` when nothing is unused (a cost), and the reverse, the
parameters behind DDP's "Expected to have finished reduction in the prior iteration" error.

``DistributedDataParallel.__init__`` is wrapped: it records the model's place in the code, its parameters (the
divergence check asks whether an optimizer's parameters are a DDP model's), and for the first :data:`WINDOW`
backward passes a hook on each parameter that notes it got a gradient. At the end of each such backward pass (a
callback queued on autograd's engine, as DDP queues its own), the parameters that got none are known by name:

- with ``find_unused_parameters=False`` (and no ``static_graph``), any is a finding now, before DDP fails at the next
  forward;
- with ``find_unused_parameters=True``, a window (or a script) in which every parameter got a gradient in every pass
  is a finding: DDP traverses the autograd graph for nothing at every step.

Backward passes inside ``no_sync()`` are not judged (DDP does not reduce there). After the window the hooks are
removed: from then on the audit costs nothing here.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from mgpucli.audit import libraries
from mgpucli.audit.session import Session
from mgpucli.torch_parts import at_backward_end, replace

WINDOW = 50  # backward passes watched per DDP model
MIN_PASSES = 2  # a find_unused_parameters=True verdict needs at least this many


def unused_names(expected: dict[int, str], fired: set[int]) -> list[str]:
    """The names of the parameters that got no gradient, in the model's order."""
    return [name for ident, name in expected.items() if ident not in fired]


@dataclass
class Watch:
    """One DDP model during its window."""

    ref: Any  # weakref to the DDP module
    call: libraries.Call  # what built it: the user's line, or a library called from there (and its setting's line)
    find_unused: bool
    names: dict[int, str]  # id(param) -> its name, for the parameters DDP reduces
    handles: list[Any] = field(default_factory=list)
    fired: set[int] = field(default_factory=set)
    queued: bool = False
    passes: int = 0
    saw_unused: bool = False
    done: bool = False


class Unused:
    def __init__(self, session: Session):
        self.s = session
        self._watches: list[Watch] = []

    def install(self) -> None:
        checks = self

        def watched(original):
            @functools.wraps(original)
            def __init__(ddp, *args, **kwargs):
                original(ddp, *args, **kwargs)
                try:
                    checks.built(ddp)
                except Exception as err:  # noqa: BLE001
                    checks.s.note(f"a DDP model not watched ({type(err).__name__}: {err})")

            return __init__

        replace("torch.nn.parallel.DistributedDataParallel.__init__", watched)
        self.s.at_finish(self.finish)

    def built(self, ddp: DistributedDataParallel) -> None:
        self.s.count("DDP models")
        names: dict[int, str] = {}
        for name, p in ddp.module.named_parameters():
            if p.requires_grad and id(p) not in names:
                names[id(p)] = name
        self.s.ddp_params.update(names)
        if getattr(ddp, "static_graph", False):
            return  # DDP finds the unused parameters itself, once
        call = libraries.here(setting=True)
        if call.library is not None and self.s.library is None:
            self.s.library = call.library  # the job's library: the others' fixes are said in its terms too
        watch = Watch(weakref.ref(ddp), call, bool(ddp.find_unused_parameters), names)
        for p in ddp.module.parameters():
            if id(p) in names:
                watch.handles.append(p.register_post_accumulate_grad_hook(functools.partial(self._fired, watch)))
        self._watches.append(watch)

    def _fired(self, watch: Watch, param: torch.Tensor) -> None:
        watch.fired.add(id(param))
        if not watch.queued:
            watch.queued = True
            at_backward_end(functools.partial(self._backward_done, watch))

    def _backward_done(self, watch: Watch) -> None:
        watch.queued = False
        fired, watch.fired = watch.fired, set()
        ddp = watch.ref()
        if watch.done or ddp is None or not ddp.require_backward_grad_sync:
            return  # inside no_sync(): DDP reduces nothing in this pass
        watch.passes += 1
        self.s.count("backward passes watched")
        unused = unused_names(watch.names, fired)
        if unused:
            watch.saw_unused = True
            if not watch.find_unused:
                self._report_unused(watch, unused)
        if watch.passes >= WINDOW:
            self._close(watch)

    def _close(self, watch: Watch) -> None:
        if watch.done:
            return
        watch.done = True
        for handle in watch.handles:
            handle.remove()
        watch.handles.clear()
        if watch.find_unused and not watch.saw_unused and watch.passes >= MIN_PASSES:
            self._report(
                watch, "find_unused_unneeded",
                f"find_unused_parameters=True{_in(watch.call)}, but every parameter got a gradient in all "
                f"{watch.passes} backward passes the audit watched",
                "With find_unused_parameters=True, DDP traverses the autograd graph after every forward to find "
                "parameters that take no part in the loss: work on every step, and it delays the gradient "
                "reduction. Nothing here needs it.",
                "model = DDP(model, device_ids=[local_rank])  # find_unused_parameters=False, the default",
                {"passes": watch.passes})

    def _report_unused(self, watch: Watch, unused: list[str]) -> None:
        self.s.unreduced.update(watch.names)  # DDP never reduces the bucket that waits for them: the ranks part
        shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
        self._report(
            watch, "ddp_unused_parameters",
            f"{len(unused)} parameter{'s' if len(unused) > 1 else ''} of {_model(watch.call)} got no gradient in "
            f"backward pass {watch.passes}: {shown}",
            "DDP (find_unused_parameters=False) waits for a gradient of every parameter before it reduces: the next "
            "forward fails with 'Expected to have finished reduction in the prior iteration before starting a new "
            "one' (or the job hangs at its end). These are the parameters it waited for.",
            "# either let DDP look for unused parameters at every step (it costs a graph traversal):\n"
            "model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)\n"
            "# or make every parameter take part in the loss, or freeze the unused ones before wrapping:\n"
            "for p in model.unused_part.parameters():\n"
            "    p.requires_grad_(False)",
            {"parameters": unused, "pass": watch.passes})

    def _report(self, watch: Watch, kind: str, title: str, cost: str, fix: str, details: dict[str, Any]) -> None:
        """A finding about the DDP model's settings: where the user set them (a library's settings object, else the
        line that built the model), with the fix in the terms of the library that built it."""
        call = watch.call
        fix, cost = libraries.in_terms(kind, fix, cost, call.library)
        if call.library is not None:
            details = {**details, "library": call.library.package,
                       "built_at": call.where.cite(self.s.cwd) if call.where else None}
        self.s.report(kind, title, cost, fix, call.place(kind, call.where), details)

    def finish(self, clean: bool) -> None:
        for watch in self._watches:
            self._close(watch)


def _model(call: libraries.Call) -> str:
    """``the DDP model Accelerate built``, or ``a DDP model`` (the user's own ``DDP(...)``)."""
    return f"the DDP model {call.library.name} built" if call.library is not None else "a DDP model"


def _in(call: libraries.Call) -> str:
    return f" in {_model(call)}" if call.library is not None else ""
