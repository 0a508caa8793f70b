package tracing

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the client spans (OpenTelemetry's HTTP semantic conventions).
const (
	AttrHTTPMethod     = attribute.Key("http.request.method")
	AttrHTTPStatusCode = attribute.Key("http.response.status_code")
	AttrURLFull        = attribute.Key("url.full")
	AttrServerAddress  = attribute.Key("server.address")
	AttrServerPort     = attribute.Key("server.port")
	AttrErrorType      = attribute.Key("error.type")
)

// NewClientTransport returns next with a client span of tp around each request, the spans
// OPA's HTTP clients (bundle downloads, decision-log and status uploads) make under `opa run`:
// named "HTTP " and the method, of kind client, a child of the span in the request's context,
// with the method, the URL (its user and password redacted), the server's address and port and
// the response's status code, status Error on a failed request or a status of 400 and above,
// and the W3C trace context (traceparent, tracestate) sent in the request's headers. The span
// ends when the response's body is read to its end or closed, or when the request fails.
func NewClientTransport(next http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &clientTransport{next: next, tracer: tp.Tracer(InstrumentationName)}
}

type clientTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t *clientTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := t.tracer.Start(r.Context(), "HTTP "+r.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(requestAttributes(r)...))
	// A RoundTripper does not modify its request; the propagator is decisions.go's.
	r = r.Clone(ctx)
	traceContext.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.next.RoundTrip(r)
	if err == nil && resp == nil {
		err = fmt.Errorf("http: RoundTripper implementation (%T) returned a nil *Response with a nil error", t.next)
	}
	if err != nil {
		span.SetAttributes(AttrErrorType.String(fmt.Sprintf("%T", err)))
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return resp, err
	}
	span.SetAttributes(AttrHTTPStatusCode.Int(resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetAttributes(AttrErrorType.String(strconv.Itoa(resp.StatusCode)))
		span.SetStatus(codes.Error, "")
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		span.End()
		return resp, nil
	}
	resp.Body = &spanBody{body: resp.Body, span: span}
	return resp, nil
}

// requestAttributes are the attributes of r's client span.
func requestAttributes(r *http.Request) []attribute.KeyValue {
	attrs := []attribute.KeyValue{AttrHTTPMethod.String(r.Method)}
	if r.URL == nil {
		return attrs
	}
	u := *r.URL
	if u.User != nil {
		u.User = nil
		if _, set := r.URL.User.Password(); set {
			attrs = append(attrs, AttrURLFull.String(u.Scheme+"://REDACTED:REDACTED@"+u.Host+u.RequestURI()))
		} else {
			attrs = append(attrs, AttrURLFull.String(u.Scheme+"://REDACTED@"+u.Host+u.RequestURI()))
		}
	} else {
		attrs = append(attrs, AttrURLFull.String(u.String()))
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host, port, _ = net.SplitHostPort(r.Host)
	}
	if host != "" {
		attrs = append(attrs, AttrServerAddress.String(host))
	}
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, AttrServerPort.Int(p))
	}
	return attrs
}

// spanBody ends its request's span when it is read to its end (or fails) or closed.
type spanBody struct {
	body io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.end()
	default:
		b.once.Do(func() {
			b.span.SetStatus(codes.Error, err.Error())
			b.span.End()
		})
	}
	return n, err
}

func (b *spanBody) Close() error {
	b.end()
	return b.body.Close()
}

func (b *spanBody) end() { b.once.Do(func() { b.span.End() }) }
