"""The pure core: HAMi's model, annotation codec, fit, phase-aware accounting and the refit.

Nothing in this package performs I/O or imports asyncio, NATS, gRPC or Kubernetes clients: every
service calls these functions, so the rules exist exactly once and are testable without an event
loop. Inputs are plain Kubernetes-shaped dicts and small frozen dataclasses.
"""
