"""Kubernetes device plugin API (v1beta1) and its generated Python stubs."""
