# syntax=docker/dockerfile:1
#
# One image for every production kasa process: `docker run IMAGE api|worker|relay|migrate|verify|reconcile`.
# It is built with -tags production, so it carries none of the developer tools. The `tools` target
# is the full ./bin/kasa (the bank simulator, dev, bench, soak): compose runs the simulator from it.
# docker-compose.yml at the repository root builds both and runs each subcommand as a service.

# ---- build -------------------------------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath

# Module downloads get their own layer so a source edit does not re-download them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -tags production -ldflags="-s -w" -o /out/kasa ./cmd/kasa \
 && go build -ldflags="-s -w" -o /out/kasa-tools ./cmd/kasa \
 && mkdir -p /out/data

# ---- tools: the full binary, for the bank simulator -------------------------------------------
FROM gcr.io/distroless/static-debian12:nonroot AS tools
COPY --from=build /out/kasa-tools /kasa
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV KASA_BANKSIM_ADDR=0.0.0.0:8090 \
    KASA_DATA_DIR=/data
EXPOSE 8090
ENTRYPOINT ["/kasa"]

# ---- runtime -----------------------------------------------------------------------------------
# Static binary, CA certificates and tzdata, no shell: healthchecks cannot exec a tool in here.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kasa /kasa
# /data belongs to the nonroot user (65532) so that an empty named volume mounted there
# inherits that owner and a process keeping state there (the relay's embedded broker) can write.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
# Inside a container the loopback defaults of config/ would be unreachable from outside.
ENV KASA_API_ADDR=0.0.0.0:8080 \
    KASA_DATA_DIR=/data
EXPOSE 8080
ENTRYPOINT ["/kasa"]
