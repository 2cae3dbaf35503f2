"""webdataset's currying of stage functions: ``pipelinefilter``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["FilterFunction", "RestCurried", "pipelinefilter"]


class FilterFunction:
    """A stage function with its arguments bound: ``FilterFunction(f, *a, **kw)(src) == f(src, *a, **kw)``."""

    def __init__(self, f: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.f = f
        self.args = args
        self.kw = kw

    def __call__(self, data: Iterable[Any]) -> Any:
        """Run the stage function on ``data``."""
        return self.f(data, *self.args, **self.kw)

    def __repr__(self) -> str:
        return f"<{getattr(self.f, '__name__', self.f)} {self.args} {self.kw}>"


class RestCurried:
    """``RestCurried(f)(*a, **kw)`` is ``FilterFunction(f, *a, **kw)``."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f
        functools.update_wrapper(self, f)

    def __call__(self, *args: Any, **kw: Any) -> FilterFunction:
        """Bind the arguments."""
        return FilterFunction(self.f, *args, **kw)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RestCurried, (self.f,))


def pipelinefilter(f: Callable[..., Any]) -> RestCurried:
    """Curry ``f(src, *args, **kw)`` into a stage factory, as webdataset's ``pipelinefilter``."""
    return RestCurried(f)
