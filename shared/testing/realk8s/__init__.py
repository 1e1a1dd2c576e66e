"""A real Kubernetes control plane on 127.0.0.1, for tooling: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, unmodified upstream binaries found the way envtest
finds them (a folder named by `KUBEBUILDER_ASSETS`; etcd there or on PATH).

`numafit bench` uses it for its real-control-plane run (plain kube-scheduler beside numafit's
extender). It is product tooling, not a test fixture: nothing here imports the tests, and the
real test tier's own launcher (tests/real/controlplane.py) could build on it.

    found = assets.find()               # Assets, or the one line saying why not
    with ControlPlane.started(found, tmp) as plane:
        plane.start_scheduler(config, "kube-scheduler")
"""
