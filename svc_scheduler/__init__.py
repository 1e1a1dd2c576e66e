"""numafit svc_scheduler: the kube-scheduler extender (filter, prioritize, bind) and the pods'
admission webhook, over HTTP(S), deciding on a read model of accounting's published usage.
See svc_scheduler/README.md for the routes, flags and metrics."""
