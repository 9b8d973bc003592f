# The node's built-in base template (no registry needed). openenv and the server's
# dependencies come from wheels the test downloads on the host into wheels/ (a build's RUN
# steps reach no package index); openenv itself without its client-side extras (gradio...).
FROM e2bdev/base
USER root
COPY wheels /opt/openenv-wheels
RUN python3 -m venv /opt/openenv && \
    /opt/openenv/bin/pip install -q --no-index --find-links /opt/openenv-wheels \
        fastapi uvicorn websockets "fastmcp<4" pydantic && \
    /opt/openenv/bin/pip install -q --no-index --no-deps /opt/openenv-wheels/openenv-*.whl && \
    rm -rf /opt/openenv-wheels
WORKDIR /app
COPY models.py /app/models.py
COPY server /app/server
COPY tasks/capital.json /app/task.json
CMD ["/opt/openenv/bin/uvicorn", "server.app:app", "--host", "0.0.0.0", "--port", "8000"]
