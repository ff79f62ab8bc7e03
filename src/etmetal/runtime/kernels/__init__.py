"""Kernels of etmetal's runtime; see ``registry`` for the calling convention."""

from .registry import allow_torch_operator, lookup, register_kernel, registered_names

__all__ = ["allow_torch_operator", "lookup", "register_kernel", "registered_names"]
