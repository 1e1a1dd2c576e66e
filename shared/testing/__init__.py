"""numafit's test doubles and launchers of real components, for tests, `numafit simulate`,
`numafit up` and `numafit bench` (never for the services): the Kubernetes API emulator, the
kubelet emulator, a nats-server runner, and a launcher of upstream Kubernetes binaries
(`realk8s`). As `trio.testing` is to trio: shipped, but not the library."""
