# durapay: one image for every process type (worker, scheduler, api, simulator); the command picks one.
#   docker build -t durapay .
#   docker run --rm durapay --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first (cached while only the code changes): install them from the metadata alone.
COPY pyproject.toml README.md ./
RUN mkdir -p durapay \
    && pip install . \
    && pip uninstall -y durapay
# The package is durapay/ (its subpackages are symlinks to the top-level folders, kept as links here).
COPY durapay durapay
COPY config config
COPY gateway gateway
COPY tasks tasks
COPY workflows workflows
COPY service service
COPY simulator simulator
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 durapay

USER durapay
WORKDIR /home/durapay
# Only the demo and an unconfigured process use the data folder (embedded Valkey); compose sets Redis.
ENV DURAPAY_DATA_DIR=/home/durapay/data
EXPOSE 8780 8781
ENTRYPOINT ["durapay"]
CMD ["--help"]
