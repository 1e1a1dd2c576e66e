"""svc_deviceplugin: the kubelet device plugin (gRPC v1beta1) for fractional NVIDIA GPUs.

It discovers GPUs (NVML, or a simulated topology), advertises replicas to kubelet and the
register inventory through accounting, asks svc_refit for a NUMA refit when kubelet's allowed
GPUs miss the scheduler's reservation, answers Allocate with HAMi-core's environment, and
marks GPUs unhealthy on XID events.

Entry point: `numafit run deviceplugin` (`python -m svc_deviceplugin`, see `__main__`). Start
reading at `service` (the plugin's loops), then `allocator` (the admission decisions) and
`server` (the gRPC side).
"""
