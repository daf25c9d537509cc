"""The names and addresses of the chaos soak's DNS (``tests/faults/soak_site``), apart from
it so that the soak's checks can name them without loading that resolver themselves."""

SLOW_DNS = ".slow-dns.test"  # a lookup under it never answers in time
REBIND = ".rebind.test"  # answers ALLOWED to the API's check, INSIDE to everyone else
ALLOWED = "127.0.0.2"  # where the soak's operator allows webhooks (webhook_allow_networks)
INSIDE = "127.0.0.1"  # inside, not allowed: nothing may reach it
