"""numafit's common package: the pure core, the CLI and (later) schemas, subjects and emulators."""
