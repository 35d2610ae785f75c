"""Which earlier items each item of a persistent kernel waits for, recorded while Triton's
CPU interpreter (TRITON_INTERPRET=1) runs a launch.

Why: the interpreter runs a launch's tickets in order, so an item whose wait misses a
producer still finds it done and its output still matches; on a GPU the producer may be
late. Compare what `recording()` saw with the kernel's declared waits (its spec):

    with recording() as waits:        # ticket -> the done-pair indices it waited for
        kernel[grid](...)
    assert waits == spec_waits

It patches the runtime's ticket draw (`protocol_triton.ticket_take`) and its waits for
earlier items (`protocol_triton.ticket_wait`, `wait_done`, `decode_triton.wait_items`).
That works because the interpreter executes a kernel's Python source with its module's
globals, so `pt.ticket_take(...)` looks the attribute up in the module at every call. A
kernel's own wait helper that does not go through these is recorded the same way: pass
`(its module, its name)` to `recording()`; its first three arguments must be (done,
first, count) as `wait_done`'s. Programs run one after another under the interpreter, so
a wait belongs to the ticket drawn last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from . import decode_triton as dt
from . import protocol_triton as pt


def _value(x: Any) -> int:
    """An interpreter tensor's (first) scalar, or a constexpr / int."""
    if hasattr(x, "handle"):
        return int(x.handle.data.reshape(-1)[0])
    return int(getattr(x, "value", x))


@contextlib.contextmanager
def recording(*helpers: tuple[ModuleType, str]) -> Iterator[dict[int, set[int]]]:
    """Yield {ticket: done-pair indices its item waited for}, filled while launches run
    inside the block (tickets that waited for nothing are absent). `helpers`: a kernel's
    own wait helpers, (module, name), called as helper(done, first, count, ...)."""
    seen: dict[int, set[int]] = {}
    ticket = [-1]

    def note(first: Any, count: Any) -> None:
        f = _value(first)
        seen.setdefault(ticket[0], set()).update(range(f, f + _value(count)))

    def take(fn: Callable) -> Callable:
        def recorded(counter, n_items):
            t = fn(counter, n_items)
            ticket[0] = _value(t)
            return t

        return recorded

    def one(fn: Callable) -> Callable:  # ticket_wait(done, t, ...): item t
        def recorded(done, t, *args):
            note(t, 1)
            return fn(done, t, *args)

        return recorded

    def span(fn: Callable) -> Callable:  # helper(done, first, count, ...)
        def recorded(done, first, n, *args):
            note(first, n)
            return fn(done, first, n, *args)

        return recorded

    patches = [(pt, "ticket_take", take), (pt, "ticket_wait", one), (pt, "wait_done", span)]
    patches += [(dt, "wait_items", span)] + [(m, name, span) for m, name in helpers]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    try:
        for m, name, wrap in patches:
            setattr(m, name, wrap(getattr(m, name)))
        yield seen
    finally:
        for m, name, fn in reversed(saved):
            setattr(m, name, fn)
