"""One error type for every user mistake, so the CLI can print it and exit 2 without a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound="BaseModel")


class TpplanError(Exception):
    """A problem with the user's input: what was wrong, why, and how to fix it.

    Every message a user sees names the input (file, field or option), the reason and the fix.
    """

    def __init__(self, where: str, reason: str, fix: str) -> None:
        # a part quoting an input (a path, a name) is cut: one line, never a megabyte of it
        self.where = _cut(where, 6 * QUOTE_LIMIT)
        self.reason = _cut(reason, 25 * QUOTE_LIMIT)
        self.fix = _cut(fix, 12 * QUOTE_LIMIT)
        super().__init__(f"{self.where}: {self.reason.rstrip('.')}. Fix: {self.fix}")


QUOTE_LIMIT = 80  # characters of a bad value an error quotes (a 1.5 MB value is named by its length)


def shown(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` quoted for an error line: its repr, cut to `limit` characters with how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}\u2026 ({len(text):,} characters)"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 1]}\u2026"


def _key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def unknown_name(what: str, name: str, known: list[str], where: str, listing: str) -> TpplanError:
    """The error for a preset name nobody has: the closest names (case, dashes and dots ignored;
    difflib's similarity) as "did you mean", else the command that lists them all (`listing`)."""
    import difflib

    by_key = {_key(k): k for k in known}
    exact = [by_key[_key(name)]] if _key(name) in by_key else []
    # a name the presets start with (`h100` for h100-datasheet, h100-measured): difflib scores short ones low
    starts = [v for k, v in by_key.items() if len(_key(name)) >= 2 and k.startswith(_key(name))][:3]
    close = [by_key[k] for k in difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.6)]
    close = list(dict.fromkeys(exact + starts + close))
    also = f"`{listing}` lists them all"
    if close:
        more = f" (or {', '.join(close[1:])})" if len(close) > 1 else ""
        return TpplanError(f"{where} {name}", "no such preset or file", f"did you mean {close[0]}?{more}; {also}")
    return TpplanError(f"{where} {name}", "no such preset or file", f"{also}, or pass the path of {what} file")


def from_validation(exc: ValidationError, where: str, fix: str) -> TpplanError:
    """The first problem pydantic found, as a TpplanError naming the input and the field.

    One wording for every validated file (model configs, topologies, workloads, bench results):
    a missing field says so, an invalid one quotes pydantic's reason and the value it got, and the
    count of further problems is given so nobody expects the next run to be clean.
    """
    first = exc.errors()[0]
    more = exc.error_count() - 1
    also = f"; {more} more problem(s) follow once this is fixed" if more else ""
    if not first["loc"]:  # a rule over several fields (a model validator): its message names them
        msg = _cut(str(first["msg"]).removeprefix("Value error, "), 4 * QUOTE_LIMIT)
        return TpplanError(where, f"{msg[:1].lower()}{msg[1:]}{also}", f"correct {where} as this says")
    field = _cut(".".join(str(p) for p in first["loc"]), QUOTE_LIMIT)  # a key may be the bad value
    if first["type"] == "missing":
        reason = f"required field '{field}' is missing"
    else:
        msg = _cut(str(first["msg"]).removeprefix("Value error, "), 4 * QUOTE_LIMIT)
        reason = f"field '{field}' is invalid: {msg[:1].lower()}{msg[1:]} (got {shown(first.get('input'))})"
    return TpplanError(f"{where}: {field}", reason + also, fix.format(field=field))


def validated(model: type[M], data: object, where: str, fix: str) -> M:
    """`model` validated from `data`; its first problem raised as `from_validation` words it."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, where, fix) from None
