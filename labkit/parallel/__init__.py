"""Many devices: sharding rules and ring formulas, processes and clusters, sharded checkpoints."""
