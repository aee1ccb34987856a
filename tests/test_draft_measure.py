"""How often a drafted spec is the spec its author wrote: fixtures/wild, fixtures/corpus and
tests/data/draft, each kernel drafted from its file with its spec removed (host code kept)."""

from __future__ import annotations

import pytest

from tests.draft_measure import entries, measure

TARGET = 0.90  # arguments, roles, types and lengths (72 of the first 79 today)


@pytest.fixture(scope="module")
def results():
    out = [measure(path, kernel) for path, kernel in entries()]
    for m in out:
        launch = "-" if m.launch is None else "ok" if m.launch else "WRONG"
        print(
            f"{m.label}: args {'ok' if m.args else 'WRONG'}, launch {launch}; {'; '.join(m.why[:2])}"
        )
    return out


def test_every_kernel_is_measured(results):
    assert len(results) == len(entries()) >= 21 + 47 + 10


def test_the_launch_where_the_file_launches_the_kernel(results):
    launched = [m for m in results if m.launch is not None]
    assert len(launched) >= 15
    right = sum(bool(m.launch) for m in launched) / len(launched)
    assert right >= 0.95, f"{right:.0%} of launches read right"


def test_arguments_reach_the_target(results):
    right = sum(m.args for m in results) / len(results)
    assert right >= TARGET, f"{right:.0%} of drafts have the arguments right"


def test_own_first_drafts_are_right(results):
    own = [m for m in results if m.label.startswith("draft/")]
    assert len(own) >= 10
    assert sum(m.args for m in own) >= len(own) - 1, [m.why for m in own if not m.args]
