"""Model collections that users, tests and benchmarks share: demo models, loaders for
ExecuTorch's registries (the Metal test modules, the Cortex-M zoo), LLM-shaped examples.
Nothing here imports the runtime; models are plain ``torch.nn.Module`` factories."""
