"""Ahead-of-time: MetalBackend.preprocess, AOTI compilation and the lowering passes."""
