# syntax=docker/dockerfile:1
# The workspace image (the role of pulumi/pulumi:latest-nonroot in PKO): the pulumi CLI, the YAML,
# Node.js and Python language hosts with their runtimes, the Python SDK, and the `command` provider the
# test bed uses, running as pulumi (1000:1000). Workspaces name it in `spec.image`:
#   docker build -f deploy/images/workspace.Dockerfile -t pko-workspace:0.1.0 .
# The Go builds follow scripts/testbed/build.sh (the same modules and versions); `make images` builds the
# same image without a container engine (scripts/images/build.sh). Keep the two in step.
ARG GO_VERSION=1.26
ARG PULUMI_VERSION=v3.259.0
ARG PULUMI_YAML_VERSION=v1.38.1
ARG PULUMI_NODEJS_HOST_SDK=v3.68.0
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://example.invalid/pko-rs

FROM golang:${GO_VERSION}-bookworm AS build
ARG PULUMI_VERSION PULUMI_YAML_VERSION PULUMI_NODEJS_HOST_SDK
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
WORKDIR /w/pulumi
RUN go mod init pko.image/pulumi \
 && go mod edit -replace=github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e \
 && go get github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@${PULUMI_VERSION} github.com/pulumi/pulumi/sdk/v3@${PULUMI_VERSION} \
 && go build -mod=mod -trimpath -tags osusergo,grpcnotrace -o /out/ \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=${PULUMI_VERSION}" \
      github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
WORKDIR /w/yaml
RUN go mod init pko.image/yaml && go get github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml@${PULUMI_YAML_VERSION} \
 && go build -mod=mod -trimpath -o /out/ -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=${PULUMI_YAML_VERSION#v}" \
      github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
WORKDIR /w/hosts
RUN go mod init pko.image/hosts && go get github.com/pulumi/pulumi/sdk/v3@${PULUMI_NODEJS_HOST_SDK} \
 && go build -mod=mod -trimpath -o /out/ -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=${PULUMI_NODEJS_HOST_SDK}" \
      github.com/pulumi/pulumi/sdk/v3/nodejs/cmd/pulumi-language-nodejs github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python \
 && cp "$(go list -mod=mod -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)/python/cmd/pulumi-language-python-exec" /out/

FROM debian:bookworm-slim
ARG PULUMI_VERSION VERSION REVISION SOURCE
LABEL org.opencontainers.image.title=pko-workspace org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION} org.opencontainers.image.source=${SOURCE} \
      org.opencontainers.image.licenses=Apache-2.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git openssh-client tini nodejs npm python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd -g 1000 pulumi && useradd -u 1000 -g 1000 -d /home/pulumi -m -s /bin/sh pulumi \
 && python3 -m venv /opt/pulumi/venv && /opt/pulumi/venv/bin/pip install --no-cache-dir "pulumi==${PULUMI_VERSION#v}"
COPY --from=build /out/ /opt/pulumi/bin/
COPY scripts/testbed/command-provider/pulumi_resource_command.py /opt/pulumi/lib/
RUN printf '#!/bin/sh\nexec /opt/pulumi/venv/bin/python3 -u /opt/pulumi/lib/pulumi_resource_command.py "$@"\n' > /opt/pulumi/bin/pulumi-resource-command \
 && printf '#!/bin/sh\nexec /opt/pulumi/venv/bin/python3 -u -m pulumi.dynamic "$@"\n' > /opt/pulumi/bin/pulumi-resource-pulumi-python \
 && chmod 0755 /opt/pulumi/bin/*
ENV HOME=/home/pulumi PULUMI_SKIP_UPDATE_CHECK=true \
    PATH=/opt/pulumi/venv/bin:/opt/pulumi/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /home/pulumi
USER 1000:1000
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["pulumi"]
