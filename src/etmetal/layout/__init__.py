"""The stock-runtime layout fix: a layout-safe view_copy lowering and dim orders the stock portable kernels accept."""
