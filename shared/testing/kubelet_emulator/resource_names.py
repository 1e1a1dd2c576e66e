"""kubelet's check that a device plugin's resource is an extended resource name (the rule lives
in the core, shared/core/resource_names.py, which the kubelet version rule also reads)."""

from __future__ import annotations

from shared.core.resource_names import is_extended_resource_name

__all__ = ["is_extended_resource_name"]
