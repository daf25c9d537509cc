"""tierq: a durable, tiered job scheduler for expensive (GPU) work."""
