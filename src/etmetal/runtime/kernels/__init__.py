"""Kernels of etmetal's runtime; see ``registry`` for the calling convention."""

from .registry import lookup, register_kernel, registered_names

__all__ = ["lookup", "register_kernel", "registered_names"]
