"""The real tier: upstream Kubernetes (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet) on loopback, from the binaries named by KUBEBUILDER_ASSETS."""
