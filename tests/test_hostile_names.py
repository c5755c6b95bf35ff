"""Hostile names and values from input files (issue 35): printed as inert text, refused with one line
where no file can have them, never a traceback.

Names reach the terminal through `tpplan.text.TextConsole` (no markup unless tpplan's own, control
characters written as escapes) and the memo's files through `tpplan.text.plain`.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from cli_helpers import run_captured as run

from tpplan.errors import TpplanError
from tpplan.models.config import load_config_dict
from tpplan.text import TextConsole, plain

OSC_TITLE = "\x1b]0;pwned\x07"  # sets the terminal window's title
CSI_CLEAR = "\x1b[2J\x1b[H"  # clears the screen, cursor home
LINK = "[link=https://evil.example]tiny-llama[/link]"  # rich markup planting a hyperlink under a fake name
HOSTILE = f"evil{OSC_TITLE}{CSI_CLEAR}{LINK}[/]"


def inert(text: str) -> None:
    """No control character and no ESC reached the stream; the markup is there as plain characters."""
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text[:300])


def config(tmp_path: Path, name: str = HOSTILE) -> str:
    raw = load_config_dict("tiny-llama")[0]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "_name_or_path": name}))
    return str(path)


def test_plain_writes_control_characters_as_escapes():
    assert plain("a\x1b[2Jb\x07\x9b\u202e\nc") == "a\\x1b[2Jb\\x07\\x9b\\u202e\\x0ac"
    assert plain("line\n\tnext\x1b", keep_lines=True) == "line\n\tnext\\x1b"
    assert plain("kimi-k3 [TP8] é") == "kimi-k3 [TP8] é"  # printable text, brackets included, untouched


@pytest.mark.parametrize("command", [("audit",), ("explain",), ("search", "--topology", "h200x8-ib400")])
def test_a_config_name_with_escapes_and_markup_is_printed_as_text(tmp_path, command):
    code, out, err = run(command[0], "--model", config(tmp_path), "--tp", "2", *command[1:])
    assert code == 0, err
    inert(out + err)
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H" in out  # shown, escaped
    assert LINK in out  # the markup as characters: no hyperlink, no style


def test_a_terminal_gets_tpplans_own_styles_but_no_markup_or_controls_from_names():
    buf = io.StringIO()
    out = TextConsole(file=buf, force_terminal=True, width=200, color_system="standard")
    out.print(f"[bold]{'x'}[/] model {HOSTILE}")  # markup is off unless a call asks
    out.print("[red]NO[/]", markup=True)  # tpplan's own markup, asked for
    text = buf.getvalue()
    assert "[bold]x[/] model evil\\x1b]0;pwned" in text and LINK in text
    assert "\x1b]0;" not in text and "\x1b[2J" not in text and "\x1b]8;" not in text  # no title, clear, link
    assert "\x1b[31mNO" in text  # rich's own colour for tpplan's markup


def test_names_in_plan_workload_and_cluster_files_are_text(tmp_path):
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.files import Deployment, plan_file_data
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-llama"))
    data = json.loads(
        plan_file_data(make_plan("sequence-parallel", graph, 2), graph, {}, Deployment(tp=2)).model_dump_json()
    )
    data.update(name=f"[/]{CSI_CLEAR}", title=LINK, summary=OSC_TITLE)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    (tmp_path / "w.toml").write_text(
        f'name = "[/]{LINK}\\u001b[2J"\ninput_len = 512\noutput_len = 1\nconcurrency = 2\nnum_requests = 2\n'
        "chunk_size = 512\n"
    )
    (tmp_path / "c.toml").write_text(
        'name = "[/]\\u001b]0;x\\u0007"\nnodes = 1\ngpus_per_node = 8\ngpu = "h200-measured"\n'
        '[intra]\nkind = "nvlink"\nbandwidth_GBps = 360.0\nlatency_us = 1.0\n'
    )
    plan, work, clus = (str(tmp_path / f) for f in ("plan.json", "w.toml", "c.toml"))
    for args in (
        ("audit", "--plan", plan, "--topology", "h200x8-ib400", "--workload", work),
        ("audit", "--plan", plan, "--cluster", clus, "--workload", work),
        ("explain", "--plan", plan),
        ("search", "--cluster", clus, "--workload", work, "--top", "2"),
    ):
        code, out, err = run(args[0], "--model", "tiny-llama", "--tp", "2", *args[1:])
        assert code == 0, (args, err)
        inert(out + err)
        assert "[/]" in out, args


def test_an_error_line_quoting_a_name_is_text(tmp_path):
    code, _, err = run("audit", "--model", str(tmp_path / f"no{CSI_CLEAR}[/]such"), "--tp", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
    inert(err)
    assert "\\x1b[2J" in err and "[/]such" in err


def test_the_memo_files_write_names_as_text():
    from tpplan.report.doc import Para, Table, to_html, to_markdown

    blocks = [Para(f"model {HOSTILE}"), Table(("plan",), ((f"x{CSI_CLEAR}",),))]
    for text in (to_markdown(f"t{OSC_TITLE}", blocks), to_html(f"t{OSC_TITLE}", blocks)):
        inert(text)
        assert "\\x1b[2J" in text


# -- tracebacks fixed at their cause ------------------------------------------------------------


@pytest.mark.parametrize("option", ["--model", "--topology", "--cluster", "--workload", "--json"])
def test_a_name_longer_than_any_file_name_is_one_line(option):
    long = "a" * 300
    args = ["--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400"]
    value = long + (".json" if option == "--json" else "")
    if option == "--model":
        args[1] = value
    elif option == "--topology":
        args[5] = value
    else:
        args += [option, value]
    code, out, err = run("audit", *args)
    assert code == 2 and not out, err
    assert len(err.strip().splitlines()) == 1 and f"error: {option} " in err
    assert f"has a name of {len(value)} bytes; a file name holds at most 255" in err


def test_an_output_folder_name_over_255_bytes_is_one_line(tmp_path):
    code, _, err = run("report", "--model", "tiny-llama", "--out", str(tmp_path / ("d" * 256)))
    assert code == 2 and "--out" in err and "at most 255" in err, err


def test_a_read_with_nothing_ready_is_refused(tmp_path, monkeypatch):
    """/proc/kmsg is a regular file of size 0 whose non-blocking read returns None: one line, not a crash."""
    from tpplan import inputs

    path = tmp_path / "config.json"
    path.write_text("{}")

    class NothingReady(io.BufferedReader):
        def read(self, size: int | None = -1) -> None:  # type: ignore[override]
            return None

    real = os.fdopen
    monkeypatch.setattr(inputs.os, "fdopen", lambda fd, mode: NothingReady(real(fd, mode, buffering=0)))
    with pytest.raises(TpplanError, match="nothing to read without waiting"):
        inputs.read_text(path, "--model x", "fix")


@pytest.mark.skipif(not os.access("/proc/kmsg", os.R_OK), reason="/proc/kmsg not readable here")
def test_proc_kmsg_as_a_config_is_one_line():
    code, _, err = run("audit", "--model", "/proc/kmsg", "--tp", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_curve_points_near_float_max_are_refused(tmp_path):
    (tmp_path / "c.toml").write_text(
        'name = "c"\nnodes = 1\ngpus_per_node = 8\n[intra]\nkind = "nvlink"\nbandwidth_GBps = 360.0\nlatency_us = 1.0\n'
        '[[curves]]\nkind = "all_reduce"\nalgorithm = "ring"\nranks = 2\npoints = [[1e307, 1e-3], [1e308, 2e-3]]\n'
    )
    code, _, err = run("audit", "--model", "tiny-llama", "--tp", "2", "--cluster", str(tmp_path / "c.toml"))
    assert code == 2 and "curves.0" in err and "no collective's size or time" in err, err


def test_a_100000_character_plan_name_is_refused_at_validation(tmp_path):
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.files import Deployment, plan_file_data
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-llama"))
    data = json.loads(plan_file_data(make_plan("baseline", graph, 2), graph, {}, Deployment(tp=2)).model_dump_json())
    data["name"] = "p" * 100_000
    (tmp_path / "p.json").write_text(json.dumps(data))
    code, out, err = run("audit", "--model", "tiny-llama", "--tp", "2", "--plan", str(tmp_path / "p.json"))
    assert code == 2 and not out and len(err) < 1000, err
    assert "field 'name' is invalid" in err and "at most 200 characters" in err and "(100,002 characters)" in err


def test_a_long_model_name_is_refused(tmp_path):
    code, _, err = run("audit", "--model", config(tmp_path, "m" * 5000), "--tp", "2")
    assert code == 2 and "_name_or_path" in err and "at most 1000" in err, err


# -- wrong exits and messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (("audit", "--model", "tiny-llama", "--tp", "2"), "--topology"),
        (("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400"), "--workload"),
        (("search", "--model", "tiny-llama", "--tp", "2"), "--cluster"),
        (("search", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400"), "--workload"),
        (("report", "--model", "tiny-llama"), "--topology"),
        (("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400"), "--gpu"),
    ],
)
def test_an_empty_name_is_refused_not_read_as_not_given(command, option):
    code, out, err = run(*command, option, "")
    assert code == 2 and not out and err.startswith(f'error: {option} "": is empty'), err


def test_an_engine_version_tpplan_does_not_know_is_refused():
    args = ("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400", "--engine")
    code, out, err = run(*args, "sglang@99")
    assert code == 2 and not out, err
    assert "--engine sglang@99: tpplan knows no sglang version 99" in err and "sglang@0.5.23" in err
    assert run(*args, "sglang@0.5.23")[0] == 0  # the engine version whose source tpplan read


def test_a_cluster_error_names_the_cluster_option():
    code, _, err = run("audit", "--model", "tiny-llama", "--tp", "2", "--cluster", "h200x8-ibb400")
    assert code == 2 and err.startswith("error: --cluster h200x8-ibb400: no such preset"), err
    assert "did you mean h200x8-ib400?" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("audit", "--tp", "2"), "tpplan audit: Missing option '--model'"),
        (("audit", "--model", "tiny-llama", "--tp", "x"), "tpplan audit: Invalid value for '--tp'"),
        (
            ("audit", "--model", "tiny-llama", "--tp", "2", "--topolgy", "h200x2"),
            "tpplan audit: No such option: --topolgy",
        ),
        (("nosuchcommand",), "tpplan: No such command 'nosuchcommand'"),
    ],
)
def test_a_usage_error_is_one_line_with_the_fix(args, says):
    code, out, err = run(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {says}") and "Fix: `tpplan" in err and "--help` lists its options" in err


def test_a_bad_value_is_quoted_cut_short():
    code, _, err = run("audit", "--model", "tiny-llama", "--tp", "2", "--dtype", "x" * 1_500_000)
    assert code == 2 and len(err) < 3000, len(err)


def test_a_dollar_in_a_plan_name_is_a_dollar_in_the_plots():
    """matplotlib parsed `$\\x$` in a legend as math text and raised; names are text there too."""
    pytest.importorskip("matplotlib")
    from tpplan.report.plots import volume_vs_tp

    png = volume_vs_tp({"a$\\x$b [/]": [(2, 1.0), (4, 2.0)]}, "title $\\frac$")
    assert png.startswith(b"\x89PNG")


def test_the_collective_check_prints_a_topologys_names_as_text(capsys):
    pytest.importorskip("torch")
    from tpplan.bench.collective_check import CheckReport, CheckRow, print_report

    row = CheckRow("all_reduce", 8, 64, 1024, 2e-5, 2.2e-5, f"ring{CSI_CLEAR}{LINK}")
    print_report(CheckReport(f"topo{OSC_TITLE}", 2, "gloo", (row,)))
    out = capsys.readouterr().out
    inert(out)
    assert "topo\\x1b]0;pwned\\x07" in out
