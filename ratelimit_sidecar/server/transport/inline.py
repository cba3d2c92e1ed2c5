"""Run a coroutine in the caller, without a task, until it first suspends.

`RateLimitHandler.respond` is a coroutine that suspends only for a strict rule (a Redis call);
every other request completes on its first step. `run_inline` takes that step in the caller:
a completed coroutine gives its value at once, a suspended one comes back as an awaitable that
carries on from where it stopped (the caller awaits it in a task).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def run_inline(coroutine: Coroutine[Any, Any, T]) -> T | Resumed[T]:
    """The coroutine's value if it completes on its first step, else a `Resumed` of it."""
    try:
        yielded = coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return Resumed(coroutine, yielded)


class Resumed(Generic[T]):
    """Awaiting it hands the future the coroutine waits on to the awaiting task, and steps the
    coroutine each time the task resumes, as if the task had run it from the start."""

    def __init__(self, coroutine: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coroutine, self._yielded = coroutine, yielded

    def __await__(self) -> Generator[Any, None, T]:
        coroutine, yielded = self._coroutine, self._yielded
        while True:
            try:
                try:
                    yield yielded
                except BaseException as exc:  # the task was cancelled: the coroutine sees it
                    yielded = coroutine.throw(exc)
                else:
                    yielded = coroutine.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
