# CPU image of `boundgen serve` (docs/serving.md, "Container image and KServe").
#   docker build -t boundgen:cpu .
#   docker run --rm -p 8000:8000 -p 8001:8001 -v /path/to/score-art:/models:ro boundgen:cpu
#   (other serve flags: give the whole command, keeping --host 0.0.0.0: `boundgen:cpu serve /models --host 0.0.0.0 ...`)
# The image serves artifacts; it does not build them (`boundgen build` needs a C++ compiler).
# Artifacts must be built with the torch installed here (requirements.txt's pin, 2.13.0).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The package and the lock only: .dockerignore keeps .venv/, tests, artifacts and out/ out of the context.
WORKDIR /src
COPY pyproject.toml README.md requirements.txt ./
COPY boundgen ./boundgen
# requirements.txt as constraints (pip takes no extras there, hence the sed); PyTorch's CPU index
# supplies torch 2.13.0+cpu, which pip prefers to PyPI's CUDA build of the same version.
RUN sed -E 's/\[[^]]*\]//' requirements.txt > /tmp/constraints.txt \
 && pip install --extra-index-url https://download.pytorch.org/whl/cpu -c /tmp/constraints.txt '.[serve]' \
 && rm -rf /src /tmp/constraints.txt \
 && useradd --create-home --uid 1000 boundgen

USER boundgen
WORKDIR /home/boundgen
EXPOSE 8000 8001
# The server is PID 1 and handles SIGTERM itself: it stops admitting, lets admitted requests
# finish (--drain-timeout-s) and exits 0.
ENTRYPOINT ["boundgen"]
CMD ["serve", "/models", "--host", "0.0.0.0", "--http-port", "8000", "--grpc-port", "8001"]
