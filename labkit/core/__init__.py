"""Process setup, hardware table, meshes, timing, reports and exercise feedback."""
