"""The progress bar of `agentstate export | import | copy` on stderr: rows done, rows per
second, time elapsed and left. rich draws it, and prints its last state as one line when
stderr is not a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

BATCH = 500  # rows per update at most: rich takes a lock per update


class RateColumn(ProgressColumn):
    """Rows per second: rich's estimate over its recent updates while running, the whole
    run's once done, and the run's average so far until rich has two updates to estimate
    from (a run shorter than a batch never had them, and the column said "- rows/s")."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        speed = None if task.finished else task.speed
        if speed is None and elapsed and task.completed:
            speed = task.completed / elapsed
        return Text(f"{speed:,.0f} rows/s" if speed else "- rows/s")


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields `advance(rows)`; the bar is updated every BATCH rows or fifth of a second."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  RateColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        pending, flushed = 0, time.monotonic()

        def advance(rows: int) -> None:
            nonlocal pending, flushed
            pending += rows
            if pending >= BATCH or time.monotonic() - flushed >= 0.2:
                bar.advance(task, pending)
                pending, flushed = 0, time.monotonic()

        yield advance
        bar.advance(task, pending)
