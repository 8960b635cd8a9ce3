# One image for the web (daphne) and the workers (Celery): the serving dependencies, no torch.
# `--build-arg EXTRAS=train` adds torch (CPU), transformers and optimum-intel for a worker that runs
# imports (the `importer` service of compose.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Production defaults: no DEBUG, and the web refuses to start until DJANGO_SECRET_KEY is set.
ENV DJANGO_DEBUG=0
ARG EXTRAS=""
WORKDIR /app

COPY pyproject.toml manage.py ./
COPY chatsite chatsite
COPY inference inference
COPY templates templates
# torch from the CPU index first: PyPI's Linux wheel brings several GB of CUDA. torchvision (pulled in by
# optimum-intel) does not import beside that torch and is not needed for the export.
RUN if [ -n "$EXTRAS" ]; then pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; fi \
 && pip install -e ".${EXTRAS:+[$EXTRAS]}" \
 && if [ -n "$EXTRAS" ]; then pip uninstall -y torchvision; fi

# The models volume (SPECCHAT_MODELS_ROOT=/models in compose.yaml) starts with the shipped demo pair.
RUN useradd --create-home specchat \
 && mkdir -p /models /app/var \
 && if [ -d inference/models ]; then cp -a inference/models/. /models/; fi \
 && chown -R specchat /models /app/var
USER specchat
EXPOSE 8000
CMD ["python", "-m", "daphne", "-b", "0.0.0.0", "-p", "8000", "chatsite.asgi:application"]
