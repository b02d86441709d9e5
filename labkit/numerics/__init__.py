"""Low-precision numerics: number formats, error metrics, dtype policies and FP8 scaling."""
