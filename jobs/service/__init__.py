"""The API's other services: batches, tenants and the tenant cache."""
