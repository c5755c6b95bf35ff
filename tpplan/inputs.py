"""Every file tpplan reads goes through here: model configs, plan files, topologies, workloads and
bench results, so a hostile or careless file gets one named error (exit 2) instead of a hang, a
memory blow-up or a traceback.

The rules (docs/design.md, "Inputs"): a regular file only (a FIFO, a device or /dev/zero behind a
symlink is refused from `os.stat`, before anything is opened, so nothing blocks), at most
`MAX_INPUT_BYTES`, UTF-8, JSON or TOML nested at most `MAX_NESTING` deep, integers of at most
`MAX_INT_DIGITS` digits (checked while parsing, whatever `sys.set_int_max_str_digits` says).
Every parse problem is a `TpplanError` naming the file.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from tpplan.errors import TpplanError

MAX_INPUT_BYTES = 64 * 2**20  # the largest real input (a bench results file) is a few MiB
MAX_NESTING = 64  # configs and plan files nest 3-5 levels
MAX_INT_DIGITS = 40  # 2^128 has 39 digits; no field of any input needs more
NAME_MAX = 255  # bytes in one file name (Linux, macOS): longer, and every stat raises ENAMETOOLONG
PATH_MAX = 4096  # bytes in a whole path (Linux)
# Names an input file gives things (a plan, workload, cluster, GPU, model): shown in tables, legends and
# plot titles; a 100,000-character name made matplotlib fail to allocate (issue 35). Bounded at validation.
NAME_CHARS = 200


def check_path(path: str | Path, where: str, fix: str) -> None:
    """Refuse a path no file can have: a name over NAME_MAX bytes, a path over PATH_MAX, a NUL byte.
    pathlib's `exists()` and `is_dir()` raise on those (ENAMETOOLONG, ValueError) instead of saying no."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise TpplanError(where, "contains a NUL byte, which no file name can", fix)
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        raise TpplanError(where, f"has a name of {longest:,} bytes; a file name holds at most {NAME_MAX}", fix)
    if len(raw) > PATH_MAX:
        raise TpplanError(where, f"is {len(raw):,} bytes long; a path holds at most {PATH_MAX}", fix)


def read_text(path: str | Path, where: str, fix: str) -> str:
    """The UTF-8 text of regular file `path`; `where` names it in errors, `fix` says what to pass."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows symlinks: /dev/zero behind a link is a device here
    except FileNotFoundError:
        raise TpplanError(where, "no such file", fix) from None
    except (OSError, ValueError) as exc:
        raise TpplanError(where, f"cannot read it ({_why(exc)})", fix) from None
    if stat.S_ISDIR(st.st_mode):
        raise TpplanError(where, "is a folder, not a file", fix)
    if not stat.S_ISREG(st.st_mode):
        raise TpplanError(where, f"is not a regular file (a {_kind(st.st_mode)})", fix)
    if st.st_size > MAX_INPUT_BYTES:
        raise TpplanError(where, f"is {_mib(st.st_size)}, more than the {_mib(MAX_INPUT_BYTES)} tpplan reads", fix)
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the stat, open() still returns at once
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise TpplanError(where, "is not a regular file", fix)
            data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise TpplanError(where, f"cannot read it ({_why(exc)})", fix) from None
    if data is None:  # a non-blocking read with nothing ready (/proc/kmsg): a stream, not a file's content
        raise TpplanError(where, "has nothing to read without waiting (a kernel or device stream, not a file)", fix)
    if len(data) > MAX_INPUT_BYTES:
        raise TpplanError(where, f"is more than the {_mib(MAX_INPUT_BYTES)} tpplan reads", fix)
    return decode(data, where, fix)


def decode(data: bytes, where: str, fix: str) -> str:
    """`data` as UTF-8 (a leading byte-order mark dropped), or one line saying where it is not."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        reason = f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        raise TpplanError(where, reason, fix) from None


def parse_json(text: str, where: str, fix: str) -> Any:
    """`text` parsed as JSON within the nesting and integer limits; any problem names `where`."""
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        reason = f"malformed JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}; truncated?)"
        raise TpplanError(where, reason, fix) from None
    except _TooLong as exc:
        raise TpplanError(where, str(exc), fix) from None
    except RecursionError:
        raise TpplanError(where, f"is nested more than {MAX_NESTING} levels deep", fix) from None
    except (ValueError, TypeError, MemoryError) as exc:
        raise TpplanError(where, f"is not valid JSON ({_why(exc)})", fix) from None
    check_shape(data, where, fix)
    return data


def parse_toml(text: str, where: str, fix: str) -> dict[str, Any]:
    """`text` parsed as TOML within the nesting and integer limits; any problem names `where`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TpplanError(where, f"malformed TOML ({exc})", fix) from None
    except RecursionError:
        raise TpplanError(where, f"is nested more than {MAX_NESTING} levels deep", fix) from None
    except (ValueError, TypeError, MemoryError) as exc:  # e.g. an integer past Python's digit limit
        raise TpplanError(where, f"is not valid TOML ({_why(exc)})", fix) from None
    check_shape(data, where, fix)
    return data


def load_json(path: str | Path, where: str, fix: str) -> Any:
    """A JSON file read and parsed under every rule above."""
    return parse_json(read_text(path, where, fix), where, fix)


def load_mapping(path: str | Path, where: str, fix: str) -> dict[str, Any]:
    """A .toml or .json file whose top level is a table/object."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".toml", ".json"):
        raise TpplanError(where, f"unknown file type {suffix or '(none)'!r}", "use a .toml or .json file")
    text = read_text(path, where, fix)
    data = parse_toml(text, where, fix) if suffix == ".toml" else parse_json(text, where, fix)
    if not isinstance(data, dict):
        raise TpplanError(where, f"the top level is a {_type(data)}, not a table/object", "wrap the fields in one")
    return data


def check_shape(data: Any, where: str, fix: str) -> None:
    """Refuse nesting deeper than `MAX_NESTING` and integers longer than `MAX_INT_DIGITS` digits.

    Iterative, so a structure that parsed cannot overflow the stack here either."""
    limit = 10**MAX_INT_DIGITS
    todo: list[tuple[Any, int]] = [(data, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            if depth >= MAX_NESTING:
                raise TpplanError(where, f"is nested more than {MAX_NESTING} levels deep", fix)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= limit:
            raise TpplanError(where, f"holds an integer of more than {MAX_INT_DIGITS} digits", fix)


class _TooLong(ValueError):
    pass


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooLong(f"holds an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)[:120] or type(exc).__name__


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def _type(data: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(data), "value")


__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "check_shape",
    "decode",
    "load_json",
    "load_mapping",
    "parse_json",
    "parse_toml",
    "read_text",
]
