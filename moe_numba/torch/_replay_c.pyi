from collections.abc import Callable, Sequence
from typing import Any

from typing_extensions import disjoint_base

def replays_run() -> int: ...

@disjoint_base
class Replay:
    def __init__(self, call: Any, recorded: tuple[Any, ...]) -> None: ...

@disjoint_base
class ReplayedOp:
    def __init__(
        self,
        run: Callable[..., Any],
        names: Sequence[str],
        differentiable: tuple[int, ...] = ...,
        counted: bool = ...,
    ) -> None: ...
    def clear(self) -> None: ...
    def key(
        self, arrays: tuple[Any, ...], values: tuple[Any, ...], tokens_per_expert: Any = ...
    ) -> tuple[Any, tuple[int, ...], Any] | None: ...
    def __call__(
        self, arrays: tuple[Any, ...], values: tuple[Any, ...], tokens_per_expert: Any = ...
    ) -> tuple[Any, ...] | None: ...
    def run(
        self,
        backend: Any,
        plan: Any,
        arrays: Any,
        scalars: dict[str, Any],
        tokens_per_expert: Any = ...,
    ) -> Any: ...
