"""A tiny document model rendered to both markdown and self-contained HTML.

The memo is built once as blocks (headings, paragraphs, tables, code, images) so report.md and
report.html always say the same thing; the HTML embeds every image as base64 and loads nothing
from outside (no scripts, no external URLs), so it opens offline and renders without errors.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

from tpplan.text import plain


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str  # inline `code` and **bold** allowed


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    ordered: bool = False


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align_right: tuple[int, ...] = ()  # column indexes to right-align


@dataclass(frozen=True)
class Code:
    text: str
    lang: str = ""


@dataclass(frozen=True)
class Image:
    name: str  # file name of the PNG next to report.md
    alt: str
    png: bytes = field(repr=False, default=b"")


@dataclass(frozen=True)
class Fold:
    """Blocks a reader opens on demand: folded (`<details>`) in HTML, written out in markdown."""

    summary: str
    blocks: tuple[Block, ...]


Block = Heading | Para | Bullets | Table | Code | Image | Fold

# In HTML a table longer than this is folded under a one-line summary, so the answer and the plots
# stay on the first screens (a K3 memo's verdict table alone was ~11,000 px tall); markdown keeps it open.
FOLD_ROWS = 12


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: list[Block]) -> str:
    """GitHub-flavoured markdown; images are referenced by file name."""
    text = "\n".join([f"# {title}", "", *_markdown_lines(blocks)]).rstrip("\n") + "\n"
    return plain(text, keep_lines=True)  # names from inputs as text (issue 35)


def _markdown_lines(blocks: list[Block] | tuple[Block, ...]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Fold):
            out += _markdown_lines(b.blocks)
        elif isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [(f"{i}. " if b.ordered else "- ") + item for i, item in enumerate(b.items, 1)] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "|".join("---:" if i in b.align_right else "---" for i in range(len(b.headers))) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Code):
            out += [f"```{b.lang}", b.text.rstrip("\n"), "```", ""]
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.name})", ""]
    return out


_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")


def _inline_html(text: str) -> str:
    """`code` and **bold** as HTML; a bold run's own code spans are rendered too (no literal backticks)."""
    parts: list[str] = []
    pos = 0
    for m in _INLINE.finditer(text):
        parts.append(html.escape(text[pos : m.start()]))
        if m.group(1) is not None:
            parts.append(f"<code>{html.escape(m.group(1))}</code>")
        else:
            parts.append(f"<strong>{_inline_html(m.group(2))}</strong>")
        pos = m.end()
    parts.append(html.escape(text[pos:]))
    return "".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;
line-height:1.45;color:#1b1f24}
table{border-collapse:collapse;margin:0.6rem 0 1.2rem;font-size:0.92rem}
th,td{border:1px solid #c9d1d9;padding:0.25rem 0.5rem;vertical-align:top}th{background:#f1f3f5}
td.r{text-align:right;font-variant-numeric:tabular-nums}
code{background:#f1f3f5;padding:0 0.2rem;border-radius:3px}
pre{background:#f6f8fa;padding:0.7rem;overflow-x:auto;border-radius:4px}
img{max-width:100%;height:auto;border:1px solid #e1e4e8;margin:0.4rem 0}
details{margin:0.4rem 0 1rem}summary{cursor:pointer;color:#0b5cad}
"""


def to_html(title: str, blocks: list[Block]) -> str:
    """One self-contained HTML page: inline CSS, PNGs as data URIs, no scripts."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    out += _html_lines(blocks)
    out.append("</body></html>")
    return plain("\n".join(out) + "\n", keep_lines=True)  # names from inputs as text (issue 35)


def _html_table(b: Table) -> str:
    head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.headers)
    rows = []
    for row in b.rows:
        cells = "".join(
            f'<td class="r">{_inline_html(c)}</td>' if i in b.align_right else f"<td>{_inline_html(c)}</td>"
            for i, c in enumerate(row)
        )
        rows.append(f"<tr>{cells}</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    if len(b.rows) <= FOLD_ROWS:
        return table
    return f"<details><summary>Table: {len(b.rows)} rows (open to read)</summary>{table}</details>"


def _html_lines(blocks: list[Block] | tuple[Block, ...]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Fold):
            out.append(f"<details><summary>{_inline_html(b.summary)}</summary>")
            out += _html_lines(b.blocks)
            out.append("</details>")
        elif isinstance(b, Heading):
            lvl = min(max(b.level, 2), 6)
            out.append(f"<h{lvl}>{_inline_html(b.text)}</h{lvl}>")
        elif isinstance(b, Para):
            out.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            tag = "ol" if b.ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + f"</{tag}>")
        elif isinstance(b, Table):
            out.append(_html_table(b))
        elif isinstance(b, Code):
            out.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            out.append(f'<figure><img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}"></figure>')
    return out
