# The one image every tierq service of docker-compose.yml runs (`tierq api`, `tierq worker`, …).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY jobs ./jobs
COPY workers ./workers
COPY migrations ./migrations
RUN pip install . \
    && useradd --create-home --uid 10001 tierq

# The sources stay importable from /app, where migrations/ sits next to the jobs package.
ENV PYTHONPATH=/app
USER tierq
EXPOSE 8000 5555
CMD ["tierq", "--help"]
