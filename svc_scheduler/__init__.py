"""svc_scheduler: the kube-scheduler extender (filter, prioritize, bind) and the pods'
admission webhook, over HTTP(S), deciding on a read model of accounting's published usage.

Entry point: `numafit run scheduler` (`python -m svc_scheduler`, see `__main__`). Start
reading at `service` (start, listen, stop), then `extender` (filter reserves through
accounting), `extender_place` (where a pod goes), `extender_bind` (the bind) and `webhook`.
svc_scheduler/README.md lists the routes, flags and metrics.
"""
