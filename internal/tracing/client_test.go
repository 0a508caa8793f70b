package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/tracing"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestClientTransportSpans: each request of a traced client is a client span, a child of the
// span in its context, that sends its W3C trace context to the server, records the method, the
// URL without its password, the server and the status, is an error from status 400, and ends
// when the body is read to its end or closed.
func TestClientTransportSpans(t *testing.T) {
	var gotTraceparent []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotTraceparent = append(gotTraceparent, r.Header.Get("traceparent"))
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "bundle bytes")
	}))
	t.Cleanup(srv.Close)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	client := &http.Client{Transport: tracing.NewClientTransport(nil, tp)}
	parentCtx, parent := tp.Tracer("test").Start(t.Context(), "parent")

	u, err := url.Parse(srv.URL + "/bundles/authz.tar.gz?x=1")
	require.NoError(t, err)
	u.User = url.UserPassword("user", "secret")
	req, err := http.NewRequestWithContext(parentCtx, http.MethodGet, u.String(), nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	assert.Empty(t, rec.Ended(), "the span lasts until the body is read")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "bundle bytes", string(body))
	require.Len(t, rec.Ended(), 1, "read to its end, the body ends the span")
	require.NoError(t, resp.Body.Close())
	require.Len(t, rec.Ended(), 1, "the span ends once")

	s := rec.Ended()[0]
	assert.Equal(t, "HTTP GET", s.Name())
	assert.Equal(t, trace.SpanKindClient, s.SpanKind())
	assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
	assert.Equal(t, "00-"+s.SpanContext().TraceID().String()+"-"+s.SpanContext().SpanID().String()+"-01", gotTraceparent[0])
	a := attrs(s)
	host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	assert.Equal(t, "GET", a[tracing.AttrHTTPMethod].AsString())
	assert.Equal(t, "http://REDACTED:REDACTED@"+host+":"+port+"/bundles/authz.tar.gz?x=1", a[tracing.AttrURLFull].AsString())
	assert.NotContains(t, a[tracing.AttrURLFull].AsString(), "secret")
	assert.Equal(t, host, a[tracing.AttrServerAddress].AsString())
	p, _ := strconv.Atoi(port)
	assert.Equal(t, int64(p), a[tracing.AttrServerPort].AsInt64())
	assert.Equal(t, int64(200), a[tracing.AttrHTTPStatusCode].AsInt64())
	assert.Equal(t, codes.Unset, s.Status().Code)

	req, err = http.NewRequestWithContext(parentCtx, http.MethodPost, srv.URL+"/missing", strings.NewReader("{}"))
	require.NoError(t, err)
	resp, err = client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Len(t, rec.Ended(), 2, "closed, the body ends the span")
	s = rec.Ended()[1]
	assert.Equal(t, "HTTP POST", s.Name())
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Equal(t, int64(404), attrs(s)[tracing.AttrHTTPStatusCode].AsInt64())
	assert.Equal(t, "404", attrs(s)[tracing.AttrErrorType].AsString())
	assert.Equal(t, "http://"+host+":"+port+"/missing", attrs(s)[tracing.AttrURLFull].AsString())
	parent.End()
}

type failingTransport struct{}

func (failingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused")
}

// TestClientTransportFailedRequest: a request that fails ends its span at once, an error.
func TestClientTransportFailedRequest(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://bundles.example.com/b.tar.gz", nil)
	require.NoError(t, err)
	resp, err := tracing.NewClientTransport(failingTransport{}, tp).RoundTrip(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	require.ErrorContains(t, err, "connection refused")
	require.Len(t, rec.Ended(), 1)
	s := rec.Ended()[0]
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.Equal(t, "connection refused", s.Status().Description)
	assert.Equal(t, int64(443), attrs(s)[tracing.AttrServerPort].AsInt64())
	assert.Empty(t, req.Header.Get("traceparent"), "the caller's request is not modified")
}
