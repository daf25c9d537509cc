"""The leader: orders queued work, publishes it, and keeps SQL and Redis converged."""
