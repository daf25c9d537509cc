# The one image every tierq service of docker-compose.yml runs (`tierq api`, `tierq worker`, …).
# .dockerignore keeps the build context to what is copied below.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY workers ./workers
COPY migrations ./migrations
COPY examples ./examples
# Extras to install with it: `docker compose build --build-arg TIERQ_EXTRAS=models` gives the
# workers the document.embed and eval.similarity handlers (PyTorch and the model).
ARG TIERQ_EXTRAS=""
# The wheel is the product: built and installed, then the sources go; migrations ship inside.
RUN pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && wheel="$(ls /tmp/wheels/tierq-*.whl)" \
    && pip install "${wheel}${TIERQ_EXTRAS:+[$TIERQ_EXTRAS]}" \
    && rm -rf /tmp/wheels /app/* \
    && useradd --create-home --uid 10001 tierq
USER tierq
WORKDIR /home/tierq
# The blob store's mount point, owned by tierq, so that the named volume mounted here is too.
RUN mkdir -p /home/tierq/blobs
EXPOSE 8000 5555
# docker stop sends SIGTERM: workers leave the pool and finish their jobs, a leading
# dispatcher resigns, the API lets open requests finish (compose sets the grace periods).
STOPSIGNAL SIGTERM
CMD ["tierq", "--help"]
