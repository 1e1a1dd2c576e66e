"""numafit's common package: everything the four services share, and the tools around them.

Layers, top to bottom (import-linter contracts in pyproject.toml enforce them, `make imports`):

- `cli`: the `numafit` command (`plan`, `run`, `simulate`, `demo`, `bench`);
- `simulate`, `bench`: whole emulated clusters, run on purpose (`numafit simulate`/`bench`);
- `kube_emulator`, `kubelet_emulator`: the Kubernetes API and kubelet emulators (tests and
  simulations only; no service imports them);
- the library the services build on: `service` (the run loop, the supervisor, NATS and
  Kubernetes I/O, health, logs), `messages` (every NATS message as a typed, versioned struct),
  `accounting_client`, `subjects`, `plan`, `nats_server`, `metrics_buckets`;
- `core`: the pure HAMi rules (codec, requests, fit, accounting, quota, refit), no I/O;
- `codes`: the one enum of reply codes (stdlib only, so the core may use it).

Start reading at `core` (README, "The rules"), then `service`.
"""
