"""Every engine citation names a release or a commit (`tpplan.engines.citations`): the records' `Source`s walked
from `ENGINES` and every module of the engine packages, the literal references written at any `Source(...)` in
the code, and every `Source.unread(...)` says why. Issue 32 closed with the SGLang P/D router cited "commit
not recorded" and vLLM's proxy at a main commit; these tests keep such a citation from coming back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tpplan.engines import ENGINES
from tpplan.engines.citations import held, kind, sources_of, unread_calls
from tpplan.engines.schema import Source

TPPLAN = Path(__file__).resolve().parents[2] / "tpplan"


def cited(ref: str) -> Source:
    return Source("owner/repo", "path.py", "function", ref)


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("0.5.23 (PyPI wheel)", "release"),
        ("0.34.0 (PyPI sdist, commit 62d4bc3c)", "release"),
        ("sglang-router 0.3.2 (PyPI sdist, its Python bindings)", "release"),
        ("torch 2.13.0 (commit cf30153c)", "release"),
        ("commit 4eb3ad5a", "commit"),
        ("PR #34059 description 2026-08-08 (open; code not read)", "pull request"),
        # what issue 32 closed with, and other things nobody could check out
        ("sgl-router Rust source as the code index stores it (commit not recorded)", None),
        ("later index revisions (commits not given by the index)", None),
        ("the search index's stored copy (commit not pinned)", None),
        ("main", None),
        ("0.5.23", None),  # a version must say what was read (wheel, sdist, commit)
        ("commit main", None),
        ("", None),
    ],
)
def test_kind_names_what_a_reference_pins(ref: str, expected: str | None) -> None:
    assert kind(cited(ref)) == expected


def test_unread_is_its_own_kind() -> None:
    assert kind(Source.unread("owner/repo", "path.py", "what", why="because")) == "unread"


def test_every_source_the_records_hold_is_pinned() -> None:
    found = held()
    loose = sorted(f"{where}: {s.cite()}" for s, where in found.items() if kind(s) is None)
    assert not loose, "citations without a release or commit:\n" + "\n".join(loose)
    assert len(found) > 200  # the walk reaches the records (about 290 sources today), not a handful


def test_the_walk_reaches_each_release_s_p_d_router_and_proxy() -> None:
    """The two citations issue 32 closed on, read again at releases: SGLang's router in sglang-router 0.3.2's
    sdist, vLLM's proxy in 0.34.0's sdist."""
    found = held()
    sgl, vllm = ENGINES["sglang@0.5.23"].handoff, ENGINES["vllm@0.34.0"].handoff
    assert sgl is not None and sgl.router is not None and vllm is not None and vllm.router is not None
    for fact in sgl.router.facts:
        assert fact.source in found and fact.source.ref.startswith("sglang-router 0.3.2 (PyPI sdist")
    assert [f.source.ref for f in vllm.router.facts] == ["0.34.0 (PyPI sdist, commit 62d4bc3c)"]


def _source_calls() -> list[tuple[str, int, ast.Call]]:
    out = []
    for path in sorted(TPPLAN.rglob("*.py")):
        text = path.read_text()
        if "Source(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Source":
                out.append((str(path.relative_to(TPPLAN.parent)), node.lineno, node))
    return out


def test_every_literal_reference_in_the_code_is_pinned() -> None:
    """Sources built inside functions escape the walk; a reference written as a plain string is checked here
    (one built from a variable is the walk's: its helpers' results are module-level records)."""
    literal = 0
    loose = []
    for where, line, call in _source_calls():
        ref = call.args[3] if len(call.args) > 3 else next((k.value for k in call.keywords if k.arg == "ref"), None)
        if isinstance(ref, ast.Constant) and isinstance(ref.value, str):
            literal += 1
            repo = call.args[0]
            if isinstance(repo, ast.Constant) and repo.value == "tpplan":
                continue  # tpplan's own code ("this tree"), not an engine's
            if kind(cited(ref.value)) is None:
                loose.append(f"{where}:{line}: {ref.value!r}")
    assert not loose, "\n".join(loose)
    assert literal >= 10


def test_every_unread_says_why() -> None:
    calls = unread_calls()
    assert len(calls) >= 3  # the walk finds them: 8 left after the 2026-12-06 reading, in engines/ and simulate/
    missing = [f"{c.path} {c.function}: {c.what}" for c in calls if not (c.why and c.why.strip())]
    assert not missing, "Source.unread without a plain-string why=:\n" + "\n".join(missing)


def test_docs_list_every_unread_with_its_reason() -> None:
    doc = (TPPLAN.parent / "docs" / "engines.md").read_text()
    section = doc[doc.index("## Citations: what each fact was read at") :]
    for c in unread_calls():
        assert f"{c.what} ({c.why})" in section


# A release's record may name an older revision beside the release it cites for the same fact, as corroboration.
OLDER_BESIDE_RELEASE = {("sglang@0.5.23", "commit 00ff98d3")}  # event_loop_pp: the same pp_loop_size slots


def test_a_release_s_record_cites_that_release() -> None:
    """What issue 32 closed on, vLLM 0.34.0's proxy read at a main commit, is pinned but not the release: in a
    release's record every citation is that release, another package's release (sglang-router, torch), unread,
    or an older revision named beside the release (`OLDER_BESIDE_RELEASE`)."""
    loose = []
    for key, version in ENGINES.items():
        if version.release is None:  # a main revision's record cites its commits
            continue
        for source in sources_of(version):
            own = source.ref.startswith(f"{version.version} (")
            other_package = kind(source) == "release" and not source.ref[0].isdigit()
            if not (own or other_package or kind(source) == "unread" or (key, source.ref) in OLDER_BESIDE_RELEASE):
                loose.append(f"{key}: {source.cite()}")
    assert not loose, "\n".join(loose)


def test_an_unread_fact_without_a_place_cites_what_was_not_read() -> None:
    """`path_for` records a mode no wiring names for a model type with repo and path "-": the memo printed
    "source: unread (- -)". It names what was not read instead; a located fact keeps its place."""
    nowhere = Source.unread("-", "-", "sequence-parallel for gpt_oss", why="no wiring names it")
    assert nowhere.cite() == "source: unread (sequence-parallel for gpt_oss)"
    located = Source.unread("sgl-project/sglang", "python/sglang/srt/x.py", "f", why="not read")
    assert located.cite() == "source: unread (sgl-project/sglang python/sglang/srt/x.py)"
