package policy

import (
	"errors"
	"io"
	"net/http"

	opatracing "github.com/open-policy-agent/opa/v1/tracing"

	"github.com/authz-dev/authz/internal/tracing"
)

// Remote bundles are downloaded and read by OPA's bundle plugin (download.Downloader): it
// hands the response body to OPA's tarball reader, which sizes an entry's buffer from its
// header and holds every entry in memory, bounded only by size_limit_bytes per entry (1 GiB
// unless set). OPA offers no hook on that reader, and the HTTP client of a service is built
// inside OPA from its credentials (bearer, client TLS, OAuth2, AWS, …). The one place OPA lets
// a caller wrap that client's transport is distributed tracing: every service client's
// transport goes through tracing.NewTransport(transport, options) when the manager has
// tracing options. authz registers its own HTTP tracing service (below), which traces the
// clients of a Source's manager with authz's client spans (clientTracing, tracing.go) and, when
// the options carry the bundleBoundOption of a Source's manager, wraps the transport in
// boundedTransport: the body of every successful GET (a bundle download; decision logs and status are POSTs) is checked
// by a gzip+tar scanner before OPA reads a byte of it. The scanner decompresses and counts
// each chunk of the body before the chunk is handed to OPA, so OPA never holds more than the
// bounds allow; past a bound the read fails and OPA refuses the download, before any
// signature is checked.
//
// The registration replaces OPA's in the process. The other tracing options, those OPA's own
// runtime builds (otelhttp's, under `authz run`), go to the service SetOPAHTTPTracing gives, so
// `authz run` (OPA's runtime) and http.send are traced as OPA traces them; `authz serve` runs no
// OPA runtime and does not link otelhttp.
func init() {
	opatracing.RegisterHTTPTracing(boundedHTTPTracing{})
}

// opaHTTPTracing traces the clients and handlers whose tracing options OPA's runtime built
// (SetOPAHTTPTracing); nil where no OPA runtime runs.
var opaHTTPTracing opatracing.HTTPTracingService

// SetOPAHTTPTracing gives the HTTP tracing service of OPA's own tracing options (OPA's, which
// traces with otelhttp): the program that runs OPA's runtime (cmd/authz-opa) sets it before it
// starts. Options of authz's own (a Source's manager) are still traced by authz.
func SetOPAHTTPTracing(s opatracing.HTTPTracingService) { opaHTTPTracing = s }

// bundleBoundOption, among a manager's tracing options, bounds the bundles its service
// clients download.
type bundleBoundOption struct {
	lim   bundleLimits
	times downloadTimes // remotetime.go
	rego  regoBound     // bundlecost.go
}

type boundedHTTPTracing struct{}

// splitTracingOptions separates authz's client tracing and bound from the other options
// (OPA's own).
func splitTracingOptions(opts opatracing.Options) (client *clientTracing, bound *bundleBoundOption, other opatracing.Options) {
	for _, o := range opts {
		switch v := o.(type) {
		case clientTracing:
			client = &v
		case bundleBoundOption:
			bound = &v
		default:
			other = append(other, o)
		}
	}
	return client, bound, other
}

func (boundedHTTPTracing) NewTransport(tr http.RoundTripper, opts opatracing.Options) http.RoundTripper {
	client, bound, other := splitTracingOptions(opts)
	switch {
	case client != nil:
		tr = tracing.NewClientTransport(tr, client.tp)
	case opaHTTPTracing != nil && (bound == nil || len(other) > 0):
		tr = opaHTTPTracing.NewTransport(tr, other)
	}
	if bound != nil {
		tr = &boundedTransport{next: tr, lim: bound.lim, times: bound.times, rego: bound.rego}
	}
	return tr
}

func (boundedHTTPTracing) NewHandler(h http.Handler, label string, opts opatracing.Options) http.Handler {
	if opaHTTPTracing == nil {
		return h
	}
	_, _, other := splitTracingOptions(opts)
	return opaHTTPTracing.NewHandler(h, label, other)
}

// boundedTransport checks the body of every successful GET as a bundle within lim, and cuts
// it when it arrives too slowly (times).
type boundedTransport struct {
	next  http.RoundTripper
	lim   bundleLimits
	times downloadTimes
	rego  regoBound
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || resp.StatusCode != http.StatusOK || resp.Body == nil || resp.Body == http.NoBody {
		return resp, err
	}
	resp.Body = newScannedBody(newTimedBody(resp.Body, t.times), t.rego.limitsFor(req.URL, t.lim))
	return resp, nil
}

// scannedBody hands the bytes of body to its reader only after a tarScanner in its own
// goroutine has decompressed and checked them; past a bound, or on a stream that is not a
// gzipped tar, Read fails with the scanner's error. The compressed bytes are bounded by the
// total too.
type scannedBody struct {
	body    io.ReadCloser
	lim     bundleLimits
	in      chan []byte // a chunk for the scanner; closed at the end of the body
	want    chan error  // from the scanner: nil when it needs the next chunk, then its end
	started bool
	ended   bool  // the scanner returned (its verdict is in err, nil when the archive ended well)
	err     error // the scanner's error, sticky
	read    int64 // compressed bytes read
}

func newScannedBody(body io.ReadCloser, lim bundleLimits) *scannedBody {
	return &scannedBody{body: body, lim: lim, in: make(chan []byte), want: make(chan error, 1)}
}

// errScanned is the scanner's verdict on a whole archive that is within the bounds.
var errScanned = errors.New("archive scanned")

func (b *scannedBody) start() {
	b.started = true
	go func() {
		s := newTarScanner(&chunks{b: b}, b.lim)
		var err error
		for err == nil {
			_, err = s.next(io.Discard)
		}
		if err == io.EOF { //nolint:errorlint // the scanner's own end of a whole bundle only: a wrapped io.EOF is a stream cut short
			err = errScanned
		}
		// The scanner stops reading: the body's remaining chunks are not scanned.
		b.want <- err
	}()
	b.await() // the scanner's first request for a chunk
}

// await takes the scanner's next message: it wants a chunk, or it ended.
func (b *scannedBody) await() {
	if msg := <-b.want; msg != nil {
		b.ended = true
		if !errors.Is(msg, errScanned) {
			b.err = msg
		}
	}
}

func (b *scannedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if !b.started {
		b.start()
		if b.err != nil {
			return 0, b.err
		}
	}
	n, err := b.body.Read(p)
	b.read += int64(n)
	if b.read > b.lim.totalBytes {
		b.err = boundError("more than %d bytes downloaded", b.lim.totalBytes)
		return 0, b.err
	}
	if n > 0 && !b.ended {
		b.in <- p[:n]
		b.await()
		if b.err != nil {
			return 0, b.err
		}
	}
	if err != nil && !b.ended {
		close(b.in)
		b.await()
		if b.err != nil && errors.Is(b.err, errBundleBound) {
			return n, b.err
		}
	}
	return n, err
}

// Close closes the body and ends the scanner.
func (b *scannedBody) Close() error {
	if b.started && !b.ended {
		close(b.in)
		b.await()
	}
	b.ended = true
	return b.body.Close()
}

// chunks is the scanner's input: the chunks Read hands over, one at a time. It asks for the
// next chunk only when the previous one is consumed, so every byte Read returns has been
// decompressed and counted first.
type chunks struct {
	b   *scannedBody
	cur []byte
	eof bool
}

func (c *chunks) Read(p []byte) (int, error) {
	for len(c.cur) == 0 {
		if c.eof {
			return 0, io.EOF
		}
		c.b.want <- nil
		chunk, ok := <-c.b.in
		if !ok {
			c.eof = true
			return 0, io.EOF
		}
		c.cur = chunk
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}
