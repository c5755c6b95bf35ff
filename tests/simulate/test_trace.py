"""Trace files: JSON Lines and CSV, shared prefixes, and one line naming the input for every bad trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpplan.errors import TpplanError
from tpplan.simulate.trace import load_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_jsonl_and_csv_give_the_same_requests_and_later_requests_of_a_prefix_find_it_cached(tmp_path: Path) -> None:
    sys = '"prefix_id": "sys", "prefix_tokens": 60'
    jl = write(tmp_path, "t.jsonl", f'{{"arrival_s": 0, "prompt_tokens": 100, {sys}}}\n'
               f'\n{{"arrival_s": 0.5, "prompt_tokens": 80, "output_tokens": 7, {sys}}}\n'
               '{"arrival_s": 0.5, "prompt_tokens": 50}\n')  # fmt: skip
    cs = write(tmp_path, "t.csv", "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,100,,sys,60\n"
               "0.5,80,7,sys,60\n0.5,50,,,\n")  # fmt: skip
    a, b = load_trace(jl).requests, load_trace(cs).requests
    assert a == b
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.cached_tokens) for r in a] == [
        (0.0, 100, 1, 0),
        (0.5, 80, 7, 60),
        (0.5, 50, 1, 0),
    ]


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        (
            "t.jsonl",
            '{"arrival_s": 1, "prompt_tokens": 5}\n{"arrival_s": 0.5, "prompt_tokens": 5}\n',
            "line 2: arrival_s 0.5 is before",
        ),
        ("t.jsonl", '{"arrival_s": -1, "prompt_tokens": 5}\n', "line 1: arrival_s: field 'arrival_s'"),
        ("t.jsonl", '{"arrival_s": NaN, "prompt_tokens": 5}\n', "line 1: arrival_s: field 'arrival_s'"),
        ("t.jsonl", '{"arrival_s": 1e12, "prompt_tokens": 5}\n', "line 1: arrival_s: field 'arrival_s'"),
        ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 0}\n', "line 1: prompt_tokens: field 'prompt_tokens'"),
        ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 9000}\n', "exceed the model's context of 4096"),
        ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 4000, "output_tokens": 98}\n', "run past the model's context"),
        ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "extra": 1}\n', "line 1: extra: field 'extra'"),
        ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "prefix_tokens": 9, "prefix_id": "a"}\n', "exceed prompt"),
        ("t.jsonl", "[1, 2]\n", "line 1: is a list"),
        ("t.jsonl", "{oops\n", "line 1: is not JSON"),
        ("t.jsonl", "\n\n", "holds no request"),
        ("t.csv", "arrival_s,prompt_tokens\n0,5,9\n", "line 2: has a different number of cells"),
        ("t.csv", "arrival_s,prompt_tokens\n0,five\n", "line 2: prompt_tokens: field 'prompt_tokens'"),
        ("t.txt", "0,5\n", "neither a .jsonl nor a .csv"),
    ],
)
def test_a_bad_trace_is_one_error_naming_the_file_and_line(tmp_path: Path, name: str, text: str, says: str) -> None:
    p = write(tmp_path, name, text)
    with pytest.raises(TpplanError) as err:
        load_trace(p, max_context=4096)
    assert str(p) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_a_missing_trace_says_so(tmp_path: Path) -> None:
    with pytest.raises(TpplanError, match="no such file"):
        load_trace(tmp_path / "none.jsonl")
