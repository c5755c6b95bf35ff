"""Bad input to the options of the last sessions (`--spec` and its DRAFT, redundant experts, `--json`, the
cluster's `imex_channel`, workload files, the targets' units): one line on stderr naming the input, the
reason and a fix, exit 2, no traceback, nothing left behind, and what was there untouched."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from cli_helpers import run_captured as run
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tpplan.commands._serving import speculative_of
from tpplan.errors import TpplanError
from tpplan.models.config import load_config_dict, load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

WORKLOAD = str(Path(__file__).parent / "data" / "workload-prompt448-c8.toml")
LLAMA = load_config_dict("tiny-llama")[0]
EAGLE3 = {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}


def refused(tmp_path: Path, *args: str, says: tuple[str, ...]) -> str:
    """`tpplan ARGS` exits 2 with one stderr line holding each of `says` and a fix, no traceback, and
    `tmp_path` holds what it held before (nothing written, nothing removed or changed)."""
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    code, _, err = run(*args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert all(s in lines[0] for s in says) and "Fix: " in lines[0], lines[0]
    assert {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")} == before
    return lines[0]


@pytest.fixture
def trace(tmp_path: Path) -> str:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,33\n0.001,256,21\n")
    return str(path)


def spec_audit(trace: str, spec: str, model: str = "tiny-llama") -> tuple[str, ...]:
    return ("audit", "-m", model, "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline", "--json", "-",
            "--trace", trace, "--spec", spec)  # fmt: skip


def draft(tmp_path: Path, name: str, body: str | dict[str, object] | None) -> str:
    """A draft checkpoint folder `name` holding `body` as config.json (None: no config.json)."""
    folder = tmp_path / name
    folder.mkdir()
    if body is not None:
        (folder / "config.json").write_text(body if isinstance(body, str) else json.dumps(body))
    return str(folder)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (None, "is a folder without config.json"),
        ("{nope", "malformed JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"hidden_size": "big"}), "required field 'model_type' is missing"),
        ({**EAGLE3, "hidden_size": 128}, "its target hidden size is 128, the target tiny-llama's is 64"),
        ({**EAGLE3, "target_hidden_size": 96}, "its target hidden size is 96, the target tiny-llama's is 64"),
        ({**EAGLE3, "vocab_size": 999}, "its vocab_size is 999, the target tiny-llama's is 128"),
        ({**EAGLE3, "num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": 16}, "--tp 2"),
    ],
)
def test_a_bad_eagle_draft_is_refused_naming_draft(tmp_path, trace, body, says) -> None:  # type: ignore[no-untyped-def]
    folder = draft(tmp_path, "draft", body)
    refused(tmp_path, *spec_audit(trace, f"eagle:3:2:{folder}"), says=(f"--spec DRAFT {folder}:", says))


@pytest.mark.parametrize("missing", ["gone/config.json", "gone/", "./gone", "/no/such/draft"])
def test_a_draft_path_that_is_not_there_is_refused_not_taken_for_a_hub_name(tmp_path, trace, missing) -> None:  # type: ignore[no-untyped-def]
    where = missing if missing.startswith("/") else str(tmp_path / missing) if missing[0] != "." else missing
    refused(tmp_path, *spec_audit(trace, f"eagle:3:2:{where}"), says=(f"--spec DRAFT {where}", "no such file"))


def test_a_matching_draft_and_a_hub_name_still_run(tmp_path, trace) -> None:  # type: ignore[no-untyped-def]
    for name in (draft(tmp_path, "ok", EAGLE3), "org/eagle3-draft"):
        code, out, err = run(*spec_audit(trace, f"eagle:3:2:{name}"))
        assert code == 0, err
        assert json.loads(out)["plans"][0]["serving"]["decode"]["settings"]["speculative"]["draft_model"] == name


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("mtp:0:1", "K must be 1 to 16"),
        ("mtp:-2:1", "K must be 1 to 16"),
        ("mtp:99999999999999999999:2", "K must be 1 to 16"),
        ("mtp:3:nan", "A must be 1 to draft tokens + 1"),
        ("mtp:3:inf", "A must be 1 to draft tokens + 1"),
        ("mtp:3:0.5", "A must be 1 to draft tokens + 1"),
        ("medusa:3:2", "METHOD is not mtp or eagle"),
        ("", "is not METHOD:K:A[:DRAFT]"),
        (":::", "is not METHOD:K:A[:DRAFT]"),
    ],
)
def test_bad_spec_values(tmp_path, trace, spec, says) -> None:  # type: ignore[no-untyped-def]
    refused(tmp_path, *spec_audit(trace, spec, "tiny-deepseek-v3"), says=(f"--spec {spec}", says))


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("mtpeagl:0123456789.-+eEinfa/x"), max_size=24) | st.text(max_size=24))
def test_the_spec_parser_never_raises_anything_but_a_tpplan_error(text: str) -> None:
    try:
        speculative_of(text, True)
    except TpplanError as err:
        assert str(err).startswith(f"--spec {text}")


@pytest.fixture(scope="module")
def deepseek():  # type: ignore[no-untyped-def]
    return build_model_graph(load_model("tiny-deepseek-v3"))


PLAN_WORDS = ["dp-attention", "sp-moe", "baseline", "+a2a", "+redundant", "+ep", "+tbo", "2", "-1", "+", "x",
              "99999999999999999999", ".json"]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(PLAN_WORDS), max_size=6).map("".join) | st.text(max_size=30))
def test_plan_names_never_raise_anything_but_a_tpplan_error(deepseek, name: str) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(TpplanError):
        make_plan(name, deepseek, 2)


DEEPSEEK_A2A = ("audit", "-m", "tiny-deepseek-v3", "--tp", "2", "-t", "h200x8-ib400")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            ("--plan", "dp-attention+a2a", "--ep-num-redundant-experts", "100000"),
            ("100000 redundant experts", "at most 8"),
        ),
        (("--plan", "dp-attention+a2a+redundant99999999999999999999998"), ("99999999999999999999998", "at most 8")),
        (("--plan", "dp-attention+a2a+redundant1"), ("9 physical experts do not divide",)),
        (("--plan", "dp-attention+a2a", "--ep-num-redundant-experts", "-1"), ("--ep-num-redundant-experts",)),
        (("--plan", "dp-attention+a2a", "--ep-num-redundant-experts", "1.5"), ("--ep-num-redundant-experts",)),
        (("--plan", "baseline+redundant2"), ("baseline+redundant2", "splits the experts by TP")),
        (("--plan", "dp-attention+a2a+redundant2+redundant2"), ("already has 2 redundant experts",)),
    ],
)
def test_bad_redundant_experts(tmp_path, extra, says) -> None:  # type: ignore[no-untyped-def]
    refused(tmp_path, *DEEPSEEK_A2A, *extra, says=says)


def test_search_refuses_redundant_experts_no_plan_can_hold(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ("search", "-m", "tiny-deepseek-v3", "--tp", "2", "-t", "h200x8-ib400", "--ep-num-redundant-experts")
    refused(tmp_path, *args, "1000", says=("--ep-num-redundant-experts 1000", "at most 8"))


def cluster_file(tmp_path: Path, line: str) -> str:
    """The h200x8-ib400 cluster preset's file with `line` among its top-level keys."""
    from importlib import resources

    text = resources.files("tpplan.cost").joinpath("presets/clusters/h200x8-ib400.toml").read_text("utf-8")
    head, sep, rest = text.partition("\n[")
    path = tmp_path / "cluster.toml"
    path.write_text(f"{head}\n{line}\n{sep.lstrip(chr(10))}{rest}")
    return str(path)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('imex_channel = "yes"', "field 'imex_channel' is invalid: input should be a valid boolean"),
        ("imex_channel = 1", "field 'imex_channel' is invalid: input should be a valid boolean"),
        ("imex_chanel = true", "field 'imex_chanel' is invalid: extra inputs are not permitted"),
    ],
)
@pytest.mark.parametrize("topology", [(), ("-t", "h200x8-ib400")])
def test_bad_cluster_fields_with_and_without_a_topology(tmp_path, line, says, topology) -> None:  # type: ignore[no-untyped-def]
    path = cluster_file(tmp_path, line)
    refused(tmp_path, "audit", "-m", "tiny-llama", "--tp", "2", *topology, "--cluster", path, says=(path, says))


def test_a_stated_imex_channel_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tpplan.cost.topology import load_topology

    assert load_topology("h200x8-ib400", cluster=cluster_file(tmp_path, "imex_channel = true")).imex_channel is True


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ("input_len = -5", "input should be greater than or equal to 1"),
        ('input_len = "5"', "input should be a valid integer"),
        ("input_len = true", "input should be a valid integer"),
        ("input_len = nan", "input should be a valid integer"),
        ("input_len = 100\nbogus = 1", "extra inputs are not permitted"),
        ("input_len = 100\nnum_requests = 100000000000", "less than or equal to"),
        ("input_lens = []", "w.toml: input_lens must be a non-empty list"),  # a rule over fields: it said
        ("", "w.toml: give input_len (or input_lens)"),  # "(root): field '(root)' is invalid" and dumped the file
    ],
)
def test_bad_workload_fields(tmp_path, fields, says) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.toml"
    path.write_text(f'name = "w"\n{fields}\noutput_len = 1\nconcurrency = 1\nchunk_size = 512\n')
    line = refused(tmp_path, "audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "-w", str(path),
                   says=(str(path), says))  # fmt: skip
    assert "(root)" not in line and "{'name'" not in line


TARGETS = ("search", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "-w", WORKLOAD)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--ttft-target", "5 parsecs", "not a duration with a unit"),
        ("--ttft-target", "-5", "not a duration with a unit"),
        ("--ttft-target", "nan", "not a duration with a unit"),
        ("--tpot-target", "inf", "not a duration with a unit"),
        ("--tpot-target", "0ms", "must be a positive duration"),
        ("--tpot-target", "1e400s", "must be a positive duration"),
    ],
)
def test_bad_target_units(tmp_path, flag, value, says) -> None:  # type: ignore[no-untyped-def]
    refused(tmp_path, *TARGETS, flag, value, says=(f"{flag} {value}", says))


REPORT = ("report", "-m", "tiny-llama", "-t", "h200-serving", "-w", WORKLOAD, "--tp", "2", "--plan", "baseline")


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("theirs.json", "exists and tpplan did not write it"),
        ("folder", "is a folder, not a file"),
        ("nope/x.json", "does not exist"),
    ],
)
def test_report_json_never_writes_over_what_it_did_not_write(tmp_path, target, says) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "theirs.json").write_text("precious")
    (tmp_path / "folder").mkdir()
    path = str(tmp_path / target)
    refused(tmp_path, *REPORT, "--json", path, "-o", str(tmp_path / "memo"), says=(f"--json {path}", says))


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--overhead",), ("--overhead", "this run has no GPU (backend gloo)")),
        (("--overhead", "--backend", "gloo"), ("--overhead", "this run has no GPU (backend gloo)")),
        (("--experts", "2"), ("--experts 2", "hold no routed experts")),
        (("--timeout", "-1"), ("--timeout -1", "must be a positive number of seconds")),  # were rank failures,
        (("--timeout", "nan"), ("--timeout nan", "must be a positive number of seconds")),  # exit 1
        (("--timeout", "0"), ("--timeout 0", "must be a positive number of seconds")),
        (("--direct-iters", "0"), ("--direct-iters 0", "must be at least 1")),  # said --iters/--warmup
        (("--target-nodes", "5"), ("--target-nodes 5", "none is given")),  # was ignored
        (("--target-topology", "h200x8-ib400", "--target-nodes", "0"), ("--target-nodes 0", "at least 1")),
        (("--target-topology", "nope"), ("--target-topology nope", "no such preset or file")),  # said --topology
    ],
)
def test_bench_refuses_what_this_run_cannot_do_before_starting_ranks(tmp_path, extra, says) -> None:  # type: ignore[no-untyped-def]
    """--overhead times the GPU (on gloo it was silently skipped); --experts on a dense slice was ignored."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and "gloo" not in extra and "--overhead" in extra:
        pytest.skip("a GPU is here: the overhead is measured")
    out = str(tmp_path / "bench.json")
    refused(tmp_path, "bench", "-m", "tiny-llama", "-p", "baseline", "-o", out, *extra, says=says)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ((*REPORT, "-o", "-"), "--out"),
        ((*REPORT, "--json", "-", "-o", "-"), "--out"),
        (("search", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--save", "-"), "--save"),
    ],
)
def test_dash_is_standard_output_for_json_only(tmp_path, monkeypatch, args, option) -> None:  # type: ignore[no-untyped-def]
    """`-` names standard output (`--json -`); as a folder or another file output it made a folder named '-'."""
    monkeypatch.chdir(tmp_path)
    refused(tmp_path, *args, says=(f"error: {option} -: names standard output",))


ROUTED = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "-w", WORKLOAD, "--replicas", "2")


@pytest.mark.parametrize("router", ["bogus", "sglang-router:nope", "\x1b[2Jdp:x", ""])
def test_an_unknown_router_is_one_line_naming_the_releases_routers(tmp_path, router) -> None:  # type: ignore[no-untyped-def]
    line = refused(tmp_path, *ROUTED, "--router", router, says=("--router", "has no such request router"))
    assert "\x1b" not in line and "sglang-router:cache_aware" in line


GPU = 'name = "H100 variant"\nbf16_tflops = 989.0\nfp8_tflops = 1979.0\nhbm_TBps = 2.4\nmemory_GiB = 79.6\n'


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("SELF", "that GPU model has no kernel models of its own"),  # was a RecursionError traceback
        ("OTHER", "that GPU model has no kernel models of its own"),  # a cycle of two files, the same
        ("h100-datasheet", "that GPU model has no kernel models of its own"),
        ("nope", "no such preset or file"),
    ],
)
def test_kernel_models_from_names_the_file_and_never_loops(tmp_path, source, says) -> None:  # type: ignore[no-untyped-def]
    gpu, other = tmp_path / "gpu.toml", tmp_path / "other.toml"
    named = {"SELF": str(gpu), "OTHER": str(other)}.get(source, source)
    gpu.write_text(f"{GPU}kernel_models_from = {json.dumps(named)}\n")
    other.write_text(f"{GPU}kernel_models_from = {json.dumps(str(gpu))}\n")
    refused(tmp_path, "audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--gpu", str(gpu),
            says=(f"{gpu}: kernel_models_from {named}:", says))  # fmt: skip


OPTION_WORDS = ["tp", "pp", "cp", "2", "0", "-1", "²", "٣", "99999999999999999999", "1e400", ":", "/", ",", "baseline",
                "p99", "mean", "ms", "s", "nan", "inf", " ", "x"]  # fmt: skip
OPTION_TEXT = st.lists(st.sampled_from(OPTION_WORDS), max_size=8).map("".join) | st.text(max_size=16)


@settings(max_examples=100, deadline=None)
@given(OPTION_TEXT)
@example("tp2:tp2:²:1")  # '²'.isdigit() is true and int('²') raises: it was a ValueError traceback
@example("0:1000000000000")  # --layers: the range was built before its bounds were checked (memory)
@example("0:99999999999999999999")  # an OverflowError there
def test_pd_layers_and_target_parsers_raise_only_tpplan_errors(text: str) -> None:
    from tpplan.bench.model_slice import parse_layers
    from tpplan.commands._disagg import parse_pd
    from tpplan.commands._targets import targets_of

    for parse in (parse_pd, lambda t: parse_layers(t, LLAMA_SPEC), lambda t: targets_of(t, t, "p90")):
        with contextlib.suppress(TpplanError):
            parse(text)


LLAMA_SPEC = load_model("tiny-llama")


@pytest.mark.parametrize("command", ["search", "report"])
def test_a_draft_for_another_model_is_refused_before_a_search_under_targets(tmp_path, command) -> None:  # type: ignore[no-untyped-def]
    """The search under targets recorded it as every deployment skipped ('No deployment could be served'), exit 0."""
    folder = draft(tmp_path, "draft", {**EAGLE3, "hidden_size": 128})
    chat = tmp_path / "chat.toml"
    chat.write_text('name = "chat"\ninput_len = 256\noutput_len = 64\nconcurrency = 4\nchunk_size = 1024\n')
    out = ("--save", str(tmp_path / "saved")) if command == "search" else ("-o", str(tmp_path / "memo"))
    topo = "h200x8-ib400" if command == "search" else "h200-serving"
    refused(tmp_path, command, "-m", "tiny-llama", "-t", topo, "-w", str(chat), "--ttft-target", "2s", "--spec",
            f"eagle:3:2:{folder}", "--json", str(tmp_path / "out.json"), *out,
            says=(f"--spec DRAFT {folder}:", "its target hidden size is 128"))  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [("-w", WORKLOAD, "--ttft-target", "2s", "--gpus", "800000000"), ("--tp", "8", "--pp", "64", "--replicas", "4096")],
)
def test_more_gpus_than_a_cluster_holds_is_blamed_on_the_gpus_asked(tmp_path, extra) -> None:  # type: ignore[no-untyped-def]
    """It said '--nodes 100000000: must be 1 to 100000', an option nobody passed."""
    line = refused(tmp_path, "search", "-m", "tiny-llama", "-t", "h200x8-ib400", *extra,
                   says=("GPUs: need", "a cluster holds at most 100,000", "ask for fewer GPUs"))  # fmt: skip
    assert "--nodes" not in line


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--arrival-rate", "2"), "--arrival-rate 2: a closed loop or a rate takes its prompts from a workload"),
        (("--arrival-rate", "2", "--trace", "TRACE"), "--arrival-rate 2 and --trace "),
    ],
)
def test_arrival_errors_name_the_options(tmp_path, trace, extra, says) -> None:  # type: ignore[no-untyped-def]
    """They named 'arrivals' and 'arrival_rate and trace', which no option is called (found by the fuzz test)."""
    args = [trace if a == "TRACE" else a for a in extra]
    refused(tmp_path, "audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", *args, says=(says,))


@pytest.mark.parametrize("command", ["audit", "search"])
def test_requests_without_a_workload_or_trace_is_refused(tmp_path, command) -> None:  # type: ignore[no-untyped-def]
    """It was ignored: no workload or trace to take the requests from, so nothing was served (exit 0)."""
    refused(tmp_path, command, "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--requests", "4",
            says=("--requests 4: counts the requests of a workload or a trace",))  # fmt: skip
