"""Names from input files printed as text (issue 35): control characters shown as escapes.

A config's `_name_or_path`, a plan's, workload's, cluster's or GPU's name and a file path are the
user's (or an attacker's) bytes. Sent raw to a terminal, an OSC sequence sets the window title and a
CSI sequence clears the screen or moves the cursor; a bidi override reorders what is shown. `plain`
writes every such character as its Python escape (`\\x1b`, `\\u202e`), so the name stays readable
and inert. Rich markup in a name (`[link=...]`) is the other half: the consoles the commands print
through (`tpplan.commands._console.TextConsole`) parse no markup unless a call asks for it, and pass
everything through `plain`; files (markdown, HTML) use `plain` too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

# C0 controls, DEL, C1 controls, and the Unicode bidi embeddings, overrides and isolates
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_CONTROL_KEEP_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def _escape(m: re.Match[str]) -> str:
    c = ord(m[0])
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def plain(text: str, *, keep_lines: bool = False) -> str:
    """`text` with every control character (C0, DEL, C1, bidi controls) written as its escape;
    `keep_lines` keeps newlines and tabs (a report's own line breaks), else a name stays one line."""
    pattern = _CONTROL_KEEP_LINES if keep_lines else _CONTROL
    return pattern.sub(_escape, text) if pattern.search(text) else text


class TextConsole(Console):
    """A rich console that prints names from input files as text (issue 35, `tpplan.text`): no markup
    unless a call passes `markup=True` (and escapes what it interpolates), and every control character
    a string or a rendered segment holds written as its escape, so no OSC/CSI sequence reaches the
    terminal. Rich's own styling (its control segments, the styles it renders) is untouched."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("highlight", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(plain(text, keep_lines=True), **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and seg.text and not seg.text.isprintable():
                seg = Segment(plain(seg.text, keep_lines=True), seg.style, seg.control)
            yield seg


__all__ = ["TextConsole", "plain"]
