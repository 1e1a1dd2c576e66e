"""kubelet's rule for extended resource names (what a device plugin may advertise).

Only domain-prefixed names outside ``kubernetes.io`` can be advertised by a
plugin (``nvidia.com/gpu`` yes, ``gpu`` or ``kubernetes.io/gpu`` no); kubelet
refuses anything else at Register, and so does the emulator.
"""

from __future__ import annotations

import re

__all__ = ["is_extended_resource_name"]

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_extended_resource_name(name: str) -> bool:
    """True for a qualified, domain-prefixed name that is not a native resource."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    # kubelet validates the quota form "requests.<name>" as a qualified name.
    prefix, _, rest = f"requests.{name}".partition("/")
    if not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(rest) <= 63 and _NAME.fullmatch(rest) is not None
