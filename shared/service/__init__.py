"""What every numafit service shares: settings, logs, health and metrics, NATS and Kubernetes
clients, the run loop with graceful drain (`runner`), one way to wire a service (`wiring`), one
task supervisor per service (`supervisor`), one retry delay (`backoff`) and one background
recorder of Kubernetes Events (`events`)."""
