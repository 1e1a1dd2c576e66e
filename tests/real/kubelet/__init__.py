"""The real-kubelet half of the real tier: an upstream kubelet on containerd, seeing two NUMA
nodes, driving numafit's device plugin on simulated GPUs (../shared/k8s/README.md says how it
was made to run here)."""
