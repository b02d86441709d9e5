"""Beyond XLA's fusions: Pallas kernels, flash and cuDNN attention, compiled kernels' code."""
