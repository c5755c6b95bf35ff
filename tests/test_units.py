"""The unit helpers every output uses (tpplan/units.py)."""

from __future__ import annotations

from tpplan.units import GIB, gib, pct_change, pct_change_json, signed_pct


def test_pct_change_is_relative_to_the_base() -> None:
    assert pct_change(150, 100) == 50.0
    assert pct_change(75, 100) == -25.0
    assert pct_change(5, 0) == 0.0  # nothing to compare with


def test_the_json_form_rounds_and_is_null_without_a_base() -> None:
    assert pct_change_json(2, 3) == -33.33
    assert pct_change_json(5, 0) is None


def test_printed_forms() -> None:
    assert signed_pct(12.345) == "+12.3%"
    assert signed_pct(-0.04) == "-0.0%"
    assert signed_pct(None) == "" and signed_pct(None, "-") == "-"
    assert gib(1.5 * GIB) == "1.5 GiB"
    assert gib(1234.56 * GIB) == "1,234.6 GiB"
