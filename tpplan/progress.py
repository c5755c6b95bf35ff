"""Progress of long runs on stderr: rich's bar in a terminal, a line per step in a file or pipe.

rich's bar draws nothing until the run ends when stderr is not a terminal (CI logs, `2>&1 | tee`),
so there each new step prints one line instead. stderr keeps stdout (tables, JSON) clean.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn


def progress(enabled: bool, *columns: str | ProgressColumn) -> Any:
    """A `rich.progress.Progress` on stderr, or `LineProgress` when stderr is a file or pipe."""
    from tpplan.text import TextConsole

    console = TextConsole(stderr=True)  # names as text: no markup, no control characters (tpplan.text)
    if enabled and not console.is_terminal:
        return LineProgress(console)
    return Progress(*columns, disable=not enabled, console=console)


class LineProgress:
    """The part of `Progress` the runs use (add_task, update), printing a line per new step."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._tasks: list[list[Any]] = []  # [description, completed, total]

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        self._tasks.append([description, 0.0, total])
        self._say(len(self._tasks) - 1)
        return len(self._tasks) - 1

    def update(
        self,
        task_id: int,
        *,
        advance: float | None = None,
        completed: float | None = None,
        description: str | None = None,
        **_: Any,
    ) -> None:
        task = self._tasks[task_id]
        task[1] = completed if completed is not None else task[1] + (advance or 0)
        if description is not None and description != task[0]:
            task[0] = description
            self._say(task_id)

    def _say(self, task_id: int) -> None:
        description, done, total = self._tasks[task_id]
        self._console.print(f"{description} [{done:g}/{total:g}]" if total else description, markup=False)
