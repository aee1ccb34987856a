"""Property-based fuzzing of the language server over stdio (tests/server/fuzz.py): after any
sequence of valid, malformed and garbage messages the server still answers, answered every
well-formed request once, exited only when told to, and sent no traceback. Sized for CI (about 30
sequences on a few server processes); benchmarks/fuzz_lsp.py runs thousands."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.server.fuzz import (
    HUGE_EXPRESSIONS,
    Fuzzer,
    Sequence,
    sequences,
    size_expressions,
)

EXAMPLES = 30


@pytest.fixture(scope="module")
def fuzzer():
    f = Fuzzer(reuse=8)
    yield f
    f.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # a failure prints its whole sequence and the server's log; shrinking it would take minutes
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sequence=sequences())
def test_the_server_survives_any_sequence_of_messages(fuzzer: Fuzzer, sequence: Sequence):
    outcome = fuzzer.run(sequence)
    assert not outcome.failures, "\n\n".join(
        f"{f.kind}: {f.detail}\nsequence: {f.sequence}\nserver log:\n{f.log}"
        for f in outcome.failures
    )


def test_generated_sizes_include_the_huge_expressions():
    assert set(HUGE_EXPRESSIONS) <= set(size_expressions())
