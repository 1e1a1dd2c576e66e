"""What the extender remembers of recent pods from one verb to the next, bounded.

kube-scheduler sends /prioritize and /bind the pod as it was before the extender's own filter
reserved it, so the node a pod was reserved on is remembered here; and a transient refusal the
filter answered by keeping one node is remembered until the pod's bind, which shows it. Only
the most recent entries are kept: a pod whose verbs never come leaves no lasting trace."""

from __future__ import annotations

from collections import OrderedDict


class Recent:
    """A map from pod UID to a text, keeping the `limit` most recently put."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, str] = OrderedDict()

    def put(self, uid: str, value: str) -> None:
        self._items[uid] = value
        self._items.move_to_end(uid)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, uid: str) -> str | None:
        return self._items.get(uid)

    def pop(self, uid: str) -> str | None:
        return self._items.pop(uid, None)
