package main

import (
	"net/http"

	opatracing "github.com/open-policy-agent/opa/v1/tracing"
	"github.com/open-policy-agent/opa/v1/util"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/authz-dev/authz/internal/policy"
)

// OPA's runtime traces its HTTP clients (bundles, decision logs, status, http.send) and its
// server with otelhttp, from the tracing options it builds out of its distributed_tracing
// section, as `opa run` does (OPA's features/tracing). authz's HTTP tracing service, which the
// bundle bounds of internal/policy install in its place, hands those options to this one.
func init() {
	policy.SetOPAHTTPTracing(otelHTTPTracing{})
}

type otelHTTPTracing struct{}

func (otelHTTPTracing) NewTransport(tr http.RoundTripper, opts opatracing.Options) http.RoundTripper {
	return otelhttp.NewTransport(tr, util.ToSliceOf[otelhttp.Option](opts)...)
}

func (otelHTTPTracing) NewHandler(h http.Handler, label string, opts opatracing.Options) http.Handler {
	return otelhttp.NewHandler(h, label, util.ToSliceOf[otelhttp.Option](opts)...)
}
