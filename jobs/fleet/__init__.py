"""Live fleet-wide figures: the pool's capacity, the measured service rate, the metrics."""
