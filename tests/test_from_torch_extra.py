"""--from-torch on level-1-style tasks written for this project (fixtures/kb_extra: the
operations of KernelBench level 1 that are not in the shared set, written apart from the
translator): each translates into a formula whose kernel and spec the generate pipeline makes,
or fails on one line at the task's line and column saying what is not covered."""

from __future__ import annotations

from pathlib import Path

import pytest

from optiml.errors import ExitCode, FormulaError
from optiml.generate import generate
from optiml.generate.from_torch import translate
from optiml.spec import load

EXTRA = Path(__file__).resolve().parents[1] / "fixtures" / "kb_extra"
TASKS = sorted(EXTRA.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
# task number -> what the one line says
NOT_COVERED = {
    35: "nn.GroupNorm (group normalization) is not covered",
    91: "`.flip()` (a slice, an offset or a concatenation) is not covered",
    93: "is not a tensor --from-torch can tell the shape of",  # a bool mask
    95: "(a gather or scatter) is not covered",  # int targets: cross entropy
}


def test_the_set_is_the_odd_half_of_level_1():
    assert [int(p.name.split("_")[0]) for p in TASKS] == list(range(1, 100, 2))


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_a_task_translates_or_fails_on_one_line(path, tmp_path):
    n = int(path.name.split("_")[0])
    text = path.read_text()
    if n in NOT_COVERED:
        with pytest.raises(FormulaError) as e:
            translate(text, path.name)
        message = str(e.value)
        assert "\n" not in message and e.value.exit_code == ExitCode.BAD_FORMULA
        where, _, rest = message.partition(": ")
        name, line, column = where.rsplit(":", 2)
        assert name == path.name and 1 <= int(line) <= len(text.splitlines())
        assert NOT_COVERED[n] in rest, message
        return
    t = translate(text, path.name)
    g = generate(t.formula, t.name)
    assert t.output in g.checked.outputs
    cu = tmp_path / f"{t.name}.cu"
    cu.write_text(g.kernel)
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    _, kernel, spec = load(cu, t.name)
    assert [p.name for p in kernel.params] == spec.params
