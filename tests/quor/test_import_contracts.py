"""The import-linter contract that keeps Quor's modules free of import cycles."""

from tools.import_contracts import strongly_connected


def test_modules_that_import_each_other_directly_or_around_a_loop_are_found():
    edges = {
        "a": {"b"}, "b": {"c"}, "c": {"a"},  # a loop of three
        "d": {"e"}, "e": {"d"},  # two that import each other
        "f": {"a", "d"},  # imports into both, but nothing comes back
        "g": set(),
    }  # fmt: skip

    assert sorted(strongly_connected(edges)) == [["a", "b", "c"], ["d", "e"]]


def test_a_layered_graph_has_no_cycle():
    edges = {"top": {"middle", "bottom"}, "middle": {"bottom"}, "bottom": set()}

    assert strongly_connected(edges) == []
