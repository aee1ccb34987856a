"""Saving and resuming a search: the file round-trips, and a search saved at its budget and run on
builds the same tree as one that never stopped, serial or parallel."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optiml.search import Codec, Search, SearchConfig
from tests.search.toy import AsyncToy, Toy

CODEC = Codec.for_types(tuple[int, ...], int)


@pytest.mark.parametrize("parallelism", [1, 3])
async def test_a_resumed_search_equals_an_uninterrupted_one(tmp_path, parallelism):
    config = SearchConfig(seed=7, parallelism=parallelism)
    whole = Search(AsyncToy(), (), config, CODEC)
    await whole.run(max_evaluations=40)

    first = Search(AsyncToy(), (), config, CODEC)
    await first.run(max_evaluations=15)
    first.save(tmp_path / "search.json")
    resumed = Search.load(tmp_path / "search.json", AsyncToy(), CODEC)
    result = await resumed.run(max_evaluations=25)

    assert resumed.to_json() == whole.to_json()
    assert result.path == whole.best.path and result.total_evaluations == 40


async def test_running_on_the_same_object_equals_one_longer_run():
    config = SearchConfig(seed=2, parallelism=2, backup="mean")
    whole, pieces = Search(Toy(), (), config), Search(Toy(), (), config)
    await whole.run(max_evaluations=30)
    for budget in (10, 5, 15):
        await pieces.run(max_evaluations=budget)
    assert pieces.to_json() == whole.to_json()


async def test_the_file_round_trips_states_actions_and_the_random_state(tmp_path):
    search = Search(Toy(), (), SearchConfig(seed=4, parallelism=2), CODEC)
    await search.run(max_evaluations=25)
    search.save(tmp_path / "search.json")
    loaded = Search.load(tmp_path / "search.json", Toy(), CODEC)

    assert loaded.to_json() == search.to_json()
    assert loaded.config == search.config
    assert all(type(node.state) is tuple for node in loaded.nodes)
    assert loaded.best is not None and loaded.best.path == search.best.path
    saved = json.loads((tmp_path / "search.json").read_text())
    assert saved["format"] == "optiml-search/1" and len(saved["nodes"]) == len(search.nodes)
    assert saved["nodes"][1]["info"] == search.nodes[1].info


async def test_a_file_that_is_not_a_search_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a saved search"):
        Search.load(path, Toy())


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    parallelism=st.integers(1, 4),
    backup=st.sampled_from(["max", "mean"]),
    first=st.integers(0, 25),
    then=st.integers(0, 25),
    threads=st.booleans(),
)
def test_resuming_anywhere_equals_never_stopping(seed, parallelism, backup, first, then, threads):
    config = SearchConfig(seed=seed, parallelism=parallelism, backup=backup)
    toy = Toy if threads else AsyncToy
    whole = Search(toy(), (), config, CODEC)
    asyncio.run(whole.run(max_evaluations=first + then))
    part = Search(toy(), (), config, CODEC)
    asyncio.run(part.run(max_evaluations=first))
    resumed = Search.from_json(json.loads(json.dumps(part.to_json())), toy(), CODEC)
    asyncio.run(resumed.run(max_evaluations=then))
    assert resumed.to_json() == whole.to_json()
