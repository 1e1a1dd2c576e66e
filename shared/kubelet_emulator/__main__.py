"""``python -m shared.kubelet_emulator``: same as ``numafit run kubelet-emulator``."""

from shared.kubelet_emulator.cli import main

raise SystemExit(main(prog="python -m shared.kubelet_emulator"))
