"""optiml.lift.emit: an index over the thread's indices written from its affine form, whatever
the kernel's spelling, and left to the plain emitter where it is not affine."""

from __future__ import annotations

import pytest

from optiml.lift.emit import CEmitter, NotEmittable
from optiml.lift.model import INT, LONG, Binary, Builtin, Const, Param, Var

TX, BX, DX = Builtin("threadIdx.x"), Builtin("blockIdx.x"), Builtin("blockDim.x")


def test_an_index_is_written_from_its_form_in_any_spelling():
    k = Var("k", INT)
    cols = Param("cols", INT)
    # (blockIdx.x * blockDim.x + threadIdx.x) + k * cols, and threadIdx.x + (cols * k + blockDim.x * blockIdx.x)
    a = Binary("+", Binary("+", Binary("*", BX, DX, INT), TX, INT), Binary("*", k, cols, INT), INT)
    b = Binary("+", TX, Binary("+", Binary("*", cols, k, INT), Binary("*", DX, BX, INT), INT), INT)
    e = CEmitter({k.uid: "kk"}, atoms={"g.x": "col"})
    assert e.expr(a) == e.expr(b) == "(1LL * cols * kk + 1LL * col)"


def test_what_is_not_affine_keeps_its_shape_and_an_unnamed_index_is_refused():
    gx = Binary("+", Binary("*", BX, DX, INT), TX, INT)
    e = CEmitter({}, atoms={"g.x": "col"})
    assert e.expr(Binary("/", gx, Const(3, INT), INT)) == "((1LL * col) / 3)"
    with pytest.raises(NotEmittable):
        CEmitter({}, atoms={"g.y": "row"}).expr(Binary("+", gx, Const(1, LONG), LONG))
