"""svc_refit: HAMi's NUMA refit as a NATS service (`numafit.refit.v1.<node>`).

When kubelet's Topology Manager allows a container only GPUs the scheduler did not pick, the
device plugin asks here: the refit re-runs the core's fit restricted to the allowed GPUs
(phase-aware), commits the move through accounting at the revision it decided on, and records
the pod's Event.

Entry point: `numafit run refit` (`python -m svc_refit`, see `__main__`). Start reading at
`service` (one request, end to end), then `refitter` (deciding and committing it), `read_model`
(the per-node view it decides on) and `claims` (moves in flight).
"""
