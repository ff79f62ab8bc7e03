"""Ahead-of-time: which nodes go to the Metal delegate."""
