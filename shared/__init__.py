"""numafit's common package: everything the four services share, and the tools around them.

Layers, top to bottom, one folder each (import-linter contracts in pyproject.toml enforce them,
`make imports`):

- `tools`: the `numafit` command (`cli`: `plan`, `run`, `simulate`, `demo`, `up`, `bench`) and
  what it runs: `plan`, `simulate`, `local` (`numafit up`), `bench*`;
- `testing`: the test doubles and launchers of real components (tests, simulations and the
  bench only; no service imports them): `kube_emulator`, `kubelet_emulator`, `nats_server`,
  `realk8s`;
- the library the services build on, at the top of `shared`: `service` (the run loop, the
  supervisor, NATS and Kubernetes I/O, health, logs, settings), `messages` (every NATS message
  as a typed, versioned struct), `accounting_client`, `subjects`, `metrics_buckets`;
- `core`: the pure HAMi rules (codec, requests, fit, accounting, quota, refit), no I/O;
- `codes`: the one enum of reply codes (stdlib only, so the core may use it).

Start reading at `core` (docs/design/rules.md), then `service`.
"""
