"""What every numafit service shares: settings, logs, health and metrics, NATS and Kubernetes
clients, and the run loop with graceful drain."""
