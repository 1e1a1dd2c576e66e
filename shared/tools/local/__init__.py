"""`numafit up`: the whole system on this machine, for people, kubectl and Prometheus.

command          the command's options, its announcement, the run until Ctrl-C or SIGTERM
defaults         compose's ports, the state directory, the check that the ports are free
topology         the simulated nodes, from flags (--nodes, --gpus, --cpus) or a scenario file
scheduling_loop  what kube-scheduler does for every pod with the numafit scheduler name:
                 watch, /filter, /prioritize, /bind, backoff, FailedScheduling Events
kubelets         what each node's kubelet does once a pod is bound (admission through the
                 kubelet emulator and the real device plugin, release on deletion)
events           Events as client-go records them, repeats folded into one with a count
load             a steady workload (--load): GPU pods created and deleted at a steady rate
promconfig       the Prometheus scrape configuration for the stack's metrics ports
stack            all of it started, described (kubeconfig, URLs, ports) and stopped

It reuses `numafit simulate`'s cluster (shared.tools.simulate.cluster) and kubelet-side driver
(shared.tools.simulate.driver); only the parts a long-running stack needs beside them live here.
"""
