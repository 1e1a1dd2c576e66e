"""The fit cache forgets nodes that left the cluster."""

from __future__ import annotations

from shared.core.nodes import FitCache


def test_prune_drops_only_the_nodes_refused() -> None:
    cache = FitCache()
    entries = cache.entries(("shape",))
    for name in ("node-1", "node-2", "node-3"):
        entries[name] = ("stamp", None, None)  # type: ignore[assignment]  # outcome unused here
    other = cache.entries(("other",))
    other["node-2"] = ("stamp", None, None)  # type: ignore[assignment]
    assert cache.prune(lambda name: name != "node-2") == 2
    assert set(cache.entries(("shape",))) == {"node-1", "node-3"}
    assert set(cache.entries(("other",))) == set()
    assert len(cache) == 2
