"""The HTTP API (FastAPI): routes, auth, schemas and the one error format of API.md.

Build it with ``jobs.api.app.create_app(settings)``; nothing is created at import time.
"""
