"""The Python client of tierq's HTTP API."""

from jobs.client.http import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
