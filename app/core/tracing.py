"""OpenTelemetry's SDK, configured by the standard `OTEL_*` variables (docs/operations.md,
"Traces").

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter and `OTEL_SDK_DISABLED` is not
`true` (`Settings.tracing`); otherwise nothing of OpenTelemetry is imported. The exporters
are the SDK's own, found under the names the SDK gives them (its
`opentelemetry_traces_exporter` entry points: `console`, `otlp`, `otlp_proto_grpc`,
`otlp_proto_http`, and any an installed package adds); `otlp` is gRPC, or HTTP when
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` say `http/protobuf`, as
the SDK decides it. Everything else (endpoint, headers, sampler, batch sizes, resource
attributes, service name) the SDK and its exporters read from their variables themselves,
when the application is built.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

GROUP = "opentelemetry_traces_exporter"
INSTALL = "pip install 'agentstate[otel]'"
# What `install_tracing` (app/http/tracing.py) uses besides the exporters: asked of the
# installed distributions, so that nothing is imported to find out.
DISTRIBUTIONS = ("opentelemetry-sdk", "opentelemetry-instrumentation-asgi",
                 "opentelemetry-instrumentation-sqlalchemy")
_OTLP = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def exporter_names(value: str) -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER=value` asks for, as entry point names; ValueError
    saying what to fix when one is not installed. `none` (or nothing) asks for none."""
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    if names in ([], ["none"]):
        return []
    missing = [name for name in DISTRIBUTIONS if not _installed(name)]
    if missing:
        raise ValueError(f"asks for traces, but the otel extra is not installed ({missing[0]} "
                         f"is missing): {INSTALL}, or unset OTEL_TRACES_EXPORTER")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    available = sorted({point.name for point in entry_points(group=GROUP)})
    resolved = []
    for name in names:
        if name == "otlp":
            if protocol not in _OTLP:
                raise ValueError(f"is otlp, but the OTLP protocol {protocol!r} is none of "
                                 f"{', '.join(_OTLP)}")
            name = _OTLP[protocol]
        if name not in available:
            raise ValueError(f"names {name!r}, which no installed package exports traces to; "
                             f"installed: {', '.join(available)} (or none)")
        resolved.append(name)
    return resolved


def _installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def tracer_provider(names: list[str], service_version: str) -> TracerProvider:
    """A tracer provider exporting to `names` (`exporter_names`), each through a batch
    processor (its queue and schedule from `OTEL_BSP_*`), sampled as `OTEL_TRACES_SAMPLER`
    says; the service is `agentstate` unless `OTEL_SERVICE_NAME` or
    `OTEL_RESOURCE_ATTRIBUTES` name it."""
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "agentstate",
                                            SERVICE_VERSION: service_version}))
    provider = TracerProvider(resource=resource)
    for name in names:
        point = next(iter(entry_points(group=GROUP, name=name)))
        provider.add_span_processor(BatchSpanProcessor(point.load()()))
    return provider
