"""What every tierq process holds: its settings, its connections (the runtime) and its logs."""
