"""numafit's common package: everything the four services share, and the tools around them.

Layers, top to bottom (import-linter contracts in pyproject.toml enforce them, `make imports`):

- `cli`: the `numafit` command (`plan`, `run`, `simulate`, `demo`, `bench`);
- `simulate`, `bench`: whole emulated clusters, run on purpose (`numafit simulate`/`bench`);
- `kube_emulator`, `kubelet_emulator`: the Kubernetes API and kubelet emulators (tests and
  simulations only; no service imports them);
- the library the services build on: `service` (the run loop, NATS and Kubernetes I/O, health,
  logs), `accounting_client`, `ledger_wire`, `wire`, `subjects`, `plan`, `nats_server`,
  `metrics_buckets`;
- `core`: the pure HAMi rules (codec, requests, fit, accounting, quota, refit), no I/O.

Start reading at `core` (README, "The rules"), then `service`.
"""
