# numafit: one image for every component; the entrypoint is `numafit run <service>`.
#   docker build -t numafit/numafit:0.1.0 .
#   docker run --rm numafit/numafit:0.1.0 accounting --help
#
# Reproducible: every package comes from a lock file kept in the repository, pinned with its
# hashes (pip refuses anything else): requirements.lock for the runtime, requirements-build.lock
# for setuptools and wheel, which build numafit's own wheel. The base image is the one moving
# part left; pin it by digest for a release build:
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest> -t ... .
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1
WORKDIR /src
# The build tools get a virtualenv of their own, which never reaches the runtime image. Its pip
# is the one the base image's Python bundles (ensurepip), so it changes only with the base image.
# Every wheel the runtime needs is fetched (hash-checked; a dependency missing from the lock is
# refused; wheels only, so no unpinned build runs: every locked version has wheels for x86_64
# and aarch64) before the sources are copied, so a source change does not download them again.
COPY requirements-build.lock requirements.lock ./
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --only-binary=:all: -r requirements-build.lock \
 && /opt/build/bin/pip wheel --require-hashes --only-binary=:all: --wheel-dir /wheels \
      -r requirements.lock
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY svc_scheduler ./svc_scheduler
COPY svc_refit ./svc_refit
COPY svc_accounting ./svc_accounting
COPY svc_deviceplugin ./svc_deviceplugin
COPY proto ./proto
# The runtime virtualenv is made without pip (or setuptools): the build venv's pip installs into
# it from /wheels alone (--no-index), so exactly the locked versions land there, and nothing in
# the image can install packages afterwards.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/numafit \
 && /opt/build/bin/pip --python /opt/numafit/bin/python install --no-index --find-links /wheels \
      numafit

FROM ${PYTHON_IMAGE}
# The base image's own pip, setuptools and wheel go too: nothing at run time installs packages.
# A plain (non-system) user: uid 10001 is above the system range, and `useradd --system` warns
# about it; its home exists, so HOME (set from /etc/passwd for USER 10001) names a real directory.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/numafit \
      --shell /usr/sbin/nologin --no-log-init numafit
# The runtime needs nothing but the virtualenv (nats-server comes with it for the demo).
COPY --from=build /opt/numafit /opt/numafit
ENV PATH=/opt/numafit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The device plugin must write kubelet's root-owned device-plugin directory, so its Helm chart
# and compose service run it as root; everything else runs as this unprivileged user.
USER 10001
WORKDIR /home/numafit
# Documentation of the ports the components listen on: the API emulator (8080), the extender
# and webhook (8888), /metrics with /healthz and /readyz of the scheduler (9101), accounting
# (9102; compose's second replica 9112), refit (9103), the device plugin (9104) and sim-node
# (9105).
EXPOSE 8080 8888 9101 9102 9103 9104 9105 9112
ENTRYPOINT ["numafit", "run"]
CMD ["--help"]
