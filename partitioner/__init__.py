"""Ahead-of-time: which nodes of an edge program go to the Metal delegate
(``MetalPartitioner``), decided per node from what AOTInductor can compile for the target
and which fallbacks its runtime provides, and the report of what was kept out and why."""
