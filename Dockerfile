# The operator image: mpijob-operator (the operator) and mpijob-agent (the node agent, which the
# DaemonSet runs with `command: [mpijob-agent]`; on GPU-share nodes also mpijob-agent-csi, its
# CSI driver), and mpijob-launch (launch/: the binary the pods of a job launched without sshd copy
# from this image). Build from the repository root:
#   docker build -t mpijob-operator:0.1.0 .
# Three stages: mpijob-launch is built in the first, the project is installed into a virtualenv
# in the second, and only that binary and that virtualenv are copied onto a fresh slim base, so
# no Go toolchain, pip cache, build tree or source checkout ships.
# Debian's own python3 (bookworm: 3.11) in both Python stages, the same interpreter at the same
# path, so the virtualenv's links hold. `make image` (hack/operator_image.py) builds the same image
# without Docker, for the local cluster's real nodes: README "The operator's image".

# Static and reproducible, with hack/launch_binary.py's flags (GOFLAGS, LDFLAGS): its build is
# what hack/operator_image.py puts at the same path (LAUNCH_BINARY).
FROM golang:1.26-bookworm AS launch
WORKDIR /src
COPY launch /src
RUN CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false -gcflags=all=-dwarf=false" \
    go build -ldflags="-s -w" -o /mpijob-launch .

FROM debian:bookworm-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv binutils \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/mpijob
COPY pyproject.toml README.md /src/
COPY operator /src/operator
# A regular (not editable) install of the project and its runtime dependencies only: the test
# extra stays out of the image.
RUN /opt/mpijob/bin/pip install /src
# What no runtime reads (hack/operator_image.py's TRIM, the same command): pip and setuptools,
# the dependencies' test suites, the official client's unused asyncio copy, and the extension
# modules' debug symbols. The CLI's plotting (matplotlib) is the package's "plot" extra: not here.
RUN /opt/mpijob/bin/python -m pip uninstall -y -q pip setuptools \
 && rm -rf /opt/mpijob/lib/python3*/site-packages/kubernetes/aio \
 && find /opt/mpijob -depth -type d -name tests -exec rm -rf {} + \
 && find /opt/mpijob -type f -name '*.so' ! -path '*.libs/*' -exec strip --strip-unneeded {} +
# Every module compiled once, here (hack/operator_image.py's COMPILE, the same command): the
# image is read-only and runs with PYTHONDONTWRITEBYTECODE, so an image without bytecode would
# compile its whole import tree from source at every start of the operator.
RUN find /opt/mpijob -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/mpijob/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/mpijob/lib

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
# SSL_CERT_FILE: no CA bundle file is parsed at start-up (see hack/operator_image.py's CONFIG).
ENV PATH=/opt/mpijob/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SSL_CERT_FILE=/dev/null
COPY --from=build /opt/mpijob /opt/mpijob
# Root's, mode 0755 as built: the pods' init container (any uid) copies it out, nobody changes it.
COPY --from=launch /mpijob-launch /usr/local/bin/mpijob-launch
# The distroless "nonroot" uid: no home, no shell login, no write access to the image. It has a
# passwd entry because Kopf names the operator after its user (getpass fails without one).
RUN useradd --system --uid 65532 --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin nonroot
USER 65532:65532
ENTRYPOINT ["mpijob-operator"]
CMD ["--help"]
