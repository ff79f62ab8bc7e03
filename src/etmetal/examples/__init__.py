"""Model collections that users, tests and benchmarks share, as ExecuTorch ships
``executorch.examples``: the demo models, the benchmark models, loaders for ExecuTorch's
registries (the Metal test modules, the Cortex-M zoo and its lowering through the Cortex-M
flow), the strided-view and ``view_copy`` layout cases. Models are plain
``torch.nn.Module`` factories with example inputs; nothing here imports the runtime."""
