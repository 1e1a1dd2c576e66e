"""`numafit simulate` and `numafit demo`: the whole system on emulated nodes.

scenario   the YAML scenario, validated with line numbers
cluster    nats-server, the API emulator, the four services, per node kubelet + plugin
driver     kube-scheduler's calls to the extender, kubelet's admissions, pod lifecycle
report     the JSON report and the readable table
"""
