"""The ratchet the package-wide scans share (`test_no_loose_mesh_ints`, `test_no_opkind_branches`,
`test_no_mixer_branches`): a scan lists what it finds per module, `PENDING` says how many each module may
still have; a module over its allowance fails with each hit, and one under it fails too, so the allowance is
lowered in the commit that removes them and only ever goes down."""

from __future__ import annotations

from collections import Counter


def assert_ratchet(hits: list[tuple[str, str]], pending: dict[str, int], fix: str, what: str) -> None:
    """`hits`: (module, where) per finding; `fix` opens the message for findings over the allowance, `what`
    names the findings in the one for an allowance set too high."""
    counts = Counter(module for module, _ in hits)
    over = [where for module, where in hits if counts[module] > pending.get(module, 0)]
    assert not over, f"{fix}:\n" + "\n".join(over)
    stale = {module: n for module, n in pending.items() if counts[module] < n}
    assert not stale, f"fewer {what} than PENDING says; lower it to {dict(sorted(counts.items()))}"
