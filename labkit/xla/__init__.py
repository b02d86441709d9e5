"""XLA: HLO reading and comparison, deviceless GPU compiles, XLA flags."""
