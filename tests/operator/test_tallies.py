"""A Tally's counts always equal a count over its entries, whatever mix of dict writes changed it."""

from __future__ import annotations

import collections

from hypothesis import given
from hypothesis import strategies as st

from deviceshare.operator import tallies

keys = st.sampled_from("abcdef")
values = st.integers(0, 9)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("del"), keys, values),
        st.tuples(st.just("pop"), keys, values),
        st.tuples(st.just("setdefault"), keys, values),
        st.tuples(st.just("update"), keys, values),
        st.tuples(st.just("ior"), keys, values),
        st.tuples(st.just("popitem"), keys, values),
        st.tuples(st.just("clear"), keys, values),
    ),
    max_size=60,
)


@given(operations)
def test_counts_follow_every_kind_of_write(ops: list[tuple[str, str, int]]) -> None:
    tally: tallies.Tally[str, int] = tallies.Tally(lambda key, value: value % 3)
    heard: list[tuple[int | None, int | None]] = []
    tally.on_change = lambda old, new: heard.append((old, new))
    model: dict[str, int] = {}
    for op, key, value in ops:
        before = len(heard)
        if op == "set":
            tally[key] = value
            model[key] = value
        elif op == "del" and key in model:
            del tally[key]
            del model[key]
        elif op == "pop":
            assert tally.pop(key, None) == model.pop(key, None)
        elif op == "setdefault":
            assert tally.setdefault(key, value) == model.setdefault(key, value)
        elif op == "update":
            tally.update({key: value})
            model.update({key: value})
        elif op == "ior":
            tally |= {key: value}
            model |= {key: value}
        elif op == "popitem" and model:
            assert tally.popitem() == model.popitem()
        elif op == "clear":
            tally.clear()
            model.clear()
        assert dict(tally) == model
        assert tally.counts == collections.Counter(v % 3 for v in model.values())
        assert 0 not in tally.counts.values()
        if len(heard) > before:
            assert all(old is not None or new is not None for old, new in heard[before:])
