"""Large payloads and results: the byte store and the SQL records that keep it pruned safely."""
