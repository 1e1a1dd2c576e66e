"""``python -m shared.testing.kubelet_emulator``: same as ``numafit run kubelet-emulator``."""

from shared.testing.kubelet_emulator.cli import main

raise SystemExit(main(prog="python -m shared.testing.kubelet_emulator"))
