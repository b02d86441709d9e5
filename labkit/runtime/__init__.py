"""The runtime under JAX: PJRT plugins and their C API, a wrapping plugin, XLA:GPU's thunks."""
