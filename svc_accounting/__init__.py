"""svc_accounting: the single writer of GPU reservations (HAMi's pod annotations).

It keeps a ledger of every tracked pod per node (rebuilt from the annotations at start, kept
current by watches of pods, nodes and quotas), judges every `reserve` and `move` against it,
writes the pod with a resourceVersion-guarded patch, and publishes each node's usage on
`numafit.usage.v1.<node>` for the scheduler's and refit's read models.

Entry point: `numafit run accounting` (`python -m svc_accounting`, see `__main__`). Start
reading at `service` (the NATS endpoints and watches), then `operations` (one method per
operation) and `ledger` (the pure state).
"""
