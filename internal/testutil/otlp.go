package testutil

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPReceiver is a loopback OTLP/HTTP (protobuf) trace receiver: it keeps the spans it is
// sent, the service names of their resources, and what it could not read.
type OTLPReceiver struct {
	// Addr is its host:port, for a distributed_tracing address.
	Addr string

	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	errs     []error
}

// StartOTLPReceiver starts a receiver that stops when the test ends.
func StartOTLPReceiver(tb testing.TB) *OTLPReceiver {
	tb.Helper()
	r := &OTLPReceiver{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
		msg := &collectortrace.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(body, msg)
		}
		r.mu.Lock()
		if err != nil || req.URL.Path != "/v1/traces" {
			r.errs = append(r.errs, err)
		}
		for _, rs := range msg.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					r.services = append(r.services, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	tb.Cleanup(ts.Close)
	r.Addr = strings.TrimPrefix(ts.URL, "http://")
	return r
}

// Received returns what the receiver has been sent so far.
func (r *OTLPReceiver) Received() (spans []*tracepb.Span, services []string, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([]string(nil), r.services...), append([]error(nil), r.errs...)
}
