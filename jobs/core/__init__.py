"""What tierq is, in pure Python: policy, states, values, ids and errors; no I/O."""
