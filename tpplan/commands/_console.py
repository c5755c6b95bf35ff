"""One console for every command: tables and text fit 100 columns, in a terminal, a file or a pipe.

rich sizes output to the terminal, and to 80 columns in a file or pipe; a table wider than that
has its cells cut with an ellipsis or its lines cropped, silently. Here the width is the
terminal's up to WIDTH (WIDTH itself in files and pipes), every column folds a long cell onto the
next line instead of cutting it, and a table that still cannot fit is printed at its own minimum
width, never cropped. `--wide` (on the commands with low-value columns) shows every column at the
terminal's width, or WIDE columns in files and pipes.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Column, Table
from rich.text import Text

from tpplan.text import TextConsole

if TYPE_CHECKING:
    from tpplan.layout.plan import Plan

WIDTH = 100
WIDE = 250


def console(*, wide: bool = False, stderr: bool = False) -> Console:
    """A console WIDTH columns wide (narrower in a narrower terminal; WIDE or the terminal with `wide`)."""
    probe = Console(stderr=stderr)
    if wide:
        width = max(probe.width, WIDTH) if probe.is_terminal else WIDE
    else:
        width = min(probe.width, WIDTH) if probe.is_terminal else WIDTH
    return TextConsole(width=width, stderr=stderr)


def styled(markup: str) -> Text:
    """A cell or line whose markup is tpplan's own (`"[red]NO[/]"`): what a TextConsole would print literally."""
    return Text.from_markup(markup)


TEXT = 24  # a column whose widest cell is wider than this and has spaces is text: it wraps first
FOLD = 14  # no column is folded narrower than this to make a table fit


def show(out: Console, table: Table, wrap: tuple[str, ...] = ()) -> None:
    """Print `table` within the console's width: numbers and names whole, text wrapped.

    rich would shrink every column alike and fold numbers mid-digit. Here, when the table is too
    wide, text columns (a cell wider than TEXT, with spaces) wrap between words; if that is not
    enough, headers wrap between words; then the columns named in `wrap`, then every other column
    whose cells have spaces (e.g. "48.0 GiB"); last, the widest cells without spaces (long plan
    names) fold onto the next line. Nothing is cut with an ellipsis, and a table that still cannot
    fit is printed at its minimum width, not cropped.
    """
    big = out.options.update_width(10 * WIDE)
    for col in table.columns:
        col.overflow = "fold"
    if Measurement.get(out, big, table).maximum > out.width:
        room = out.width - table._extra_width - _padding(table) * len(table.columns)
        cols = _measured_columns(out, big, table, wrap)
        widths = _fold_long_names(cols, _wrapped_widths(cols, room), room)
        for col, *_ in cols:
            col.width = widths[id(col)]
    need = Measurement.get(out, big, table).minimum
    if need > out.width:  # rich would crop it: widen the console for this table only
        width, out.width = out.width, need
        try:
            out.print(table, crop=False)
        finally:
            out.width = width
    else:
        out.print(table)


# A column as `show` sizes it: the column, its wrap rank (0 text, 1 named in `wrap`, 2 other cells with
# spaces, 3 none), its width whole, with its header wrapped, and with everything wrapped (its longest word).
Sized = tuple[Column, int, int, int, int]


def _measured_columns(out: Console, big: ConsoleOptions, table: Table, wrap: tuple[str, ...]) -> list[Sized]:
    """Each column's wrap rank and widths, measured at a width where nothing wraps (`big`)."""
    cols: list[Sized] = []
    for col in table.columns:
        cells = [Measurement.get(out, big, c) for c in col.cells]
        widest = max((m.maximum for m in cells), default=0)
        head = Measurement.get(out, big, col.header)
        least = max([m.minimum for m in cells] + [head.minimum])
        spaces = any(m.minimum < m.maximum for m in cells)
        rank = 0 if spaces and widest > TEXT else 1 if spaces and str(col.header) in wrap else 2 if spaces else 3
        cols.append((col, rank, max(widest, head.maximum), max(widest, head.minimum), least))
    return cols


def _wrapped_widths(cols: list[Sized], room: int) -> dict[int, int]:
    """The widths (by column id) of the first wrapping step that fits `room`: text columns kept at least
    TEXT wide or not, headers wrapped or not, wrap ranks up to 0, 1 or 2. Columns that do not wrap get
    their width; those that wrap share what is left, each at least its longest word, the rest in
    proportion to how much more they would take."""
    steps = [(roomy, h, u) for roomy in (True, False) for h, u in ((0, 0), (1, 0), (0, 1), (1, 1), (1, 2))]
    for roomy, headers, upto in steps:
        used = sum(
            (max(a, min(w, TEXT)) if roomy and r == 0 else a) if r <= upto else (h if headers else w)
            for _, r, w, h, a in cols
        )
        if used <= room:
            break
    widths = {id(c): (a if r <= upto else (h if headers else w)) for c, r, w, h, a in cols}
    spare = room - sum(widths.values())
    wants = {id(c): w - a for c, r, w, _, a in cols if r <= upto and w > a}
    total = sum(wants.values())
    for key, want in wants.items():
        widths[key] += min(want, spare * want // total) if spare > 0 else 0
    return widths


def _fold_long_names(cols: list[Sized], widths: dict[int, int], room: int) -> dict[int, int]:
    """The last resort: long names without spaces (a found plan's name) fold onto the next line, widest
    first, down to FOLD columns each, rather than the table leaving the console's width."""
    over = sum(widths.values()) - room
    for col, *_ in sorted(cols, key=lambda c: -widths[id(c[0])]):
        if over <= 0:
            break
        cut = min(over, widths[id(col)] - FOLD)
        if cut > 0:
            widths[id(col)] -= cut
            over -= cut
    return widths


def _padding(table: Table) -> int:
    _, right, _, left = Padding.unpack(table.padding)
    return left + right


def print_markdown(out: Console, text: str) -> None:
    """Print markdown text with its tables drawn as tables that fit (`show`), the rest as text.

    The markdown itself (e.g. `bench --md`) keeps its long rows; this is the terminal's view of it.
    Cells are split on " | ", so a cell may hold a bare `|x|`.
    """
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: ")):
            out.print(lines[i], markup=False)
            i += 1
            continue
        head = _cells(lines[i])
        aligns = [c.strip() for c in lines[i + 1].strip().strip("|").split("|")]
        table = Table()
        for j, h in enumerate(head):
            right = j < len(aligns) and aligns[j].endswith(":")
            table.add_column(h, justify="right" if right else "left")
        i += 2
        while i < len(lines) and lines[i].startswith("|"):
            cells = _cells(lines[i])
            table.add_row(*(Text(c) for c in (cells + [""] * len(head))[: len(head)]))
            i += 1
        show(out, table)


def _cells(row: str) -> list[str]:
    inner = row.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    return [c.strip() for c in f" {inner} ".split(" | ")]


def print_wrapped(out: Console, line: str, indent: int = 4) -> None:
    """One plain-text line (no markup), wrapped at the console's width with a hanging indent."""
    lead = len(line) - len(line.lstrip(" "))
    out.print(
        textwrap.fill(line, out.width, subsequent_indent=" " * (lead + indent), break_on_hyphens=False),
        markup=False,
        soft_wrap=True,
    )


def print_plan_notes(plans: Iterable[Plan]) -> None:
    """What the planner noted about the plans' origin (a plan file found for another model or shape),
    each note once however many times its plan was built, on stderr so stdout stays the result."""
    err = console(stderr=True)
    for note in dict.fromkeys(n for p in plans for n in p.notes):
        print_wrapped(err, f"note: {note}", indent=2)


# In a file or pipe (CI logs, `2>&1 | tee`, a job's log) a long command prints plain progress lines:
# none for a command done within QUIET_S, then at most one line every EVERY_S.
QUIET_S = 3.0
EVERY_S = 5.0
TICK_S = 0.5  # how often a long step is looked at (a line still comes at most every EVERY_S)


class PlainSteps:
    """`steps` off a terminal: the step a command is at, as one plain stderr line at a modest rate
    (no live display, which a log would get as nothing until the end). With `tick` (seconds) a
    background thread repeats the current step while one step runs long (loading kernel tables)."""

    def __init__(self, err: Console, what: str, tick: float | None = None) -> None:
        self.err, self.what = err, what
        self.t0 = self.last = time.perf_counter()
        self.said = 0
        self.step = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if tick:
            threading.Thread(target=self._tick, args=(tick,), daemon=True, name="tpplan-steps").start()

    def __call__(self, step: str) -> None:
        self.step = step
        self._say()

    def _say(self) -> None:
        with self._lock:
            now = time.perf_counter()
            if not self.step or now - self.t0 < QUIET_S or (self.said and now - self.last < EVERY_S):
                return
            self.err.print(f"{self.what}: {self.step} ({now - self.t0:.0f} s)", markup=False, soft_wrap=True)
            self.last, self.said = now, self.said + 1

    def _tick(self, tick: float) -> None:
        while not self._stop.wait(tick):
            self._say()

    def stop(self) -> None:
        """No more lines (the thread ends); call on every exit, a failed run's included."""
        self._stop.set()

    def done(self) -> None:
        self.stop()
        with self._lock:
            if self.said:
                self.err.print(f"{self.what}: done in {time.perf_counter() - self.t0:.1f} s", markup=False)


@contextmanager
def steps(what: str) -> Iterator[Callable[[str], None]]:
    """Progress of a long command on stderr, naming the step it is at and the seconds so far
    (`report` and `search` take 10-45 s, `audit --engine` loads kernel tables for seconds): a status
    line in a terminal, plain lines in a file or pipe once the command has run QUIET_S (so a quick
    run's log holds only the result). Yields the function a command passes to the API as its
    `progress`."""
    err = TextConsole(stderr=True)
    if not err.is_terminal:
        plain = PlainSteps(err, what, tick=TICK_S)
        try:
            yield plain
        except BaseException:
            plain.stop()
            raise
        plain.done()
        return
    t0 = time.perf_counter()
    with err.status(Text(f"{what} ...")) as status:  # Text: a status string would be parsed as markup

        def say(step: str) -> None:
            status.update(Text(f"{what}: {step} ({time.perf_counter() - t0:.0f} s)"))

        yield say
    if time.perf_counter() - t0 >= QUIET_S:  # the status line is gone: say how long a long run took
        err.print(f"{what}: done in {time.perf_counter() - t0:.1f} s", markup=False)
