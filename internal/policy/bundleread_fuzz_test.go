package policy

import (
	"bytes"
	"compress/gzip"
	"io"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/authz-dev/authz/internal/policy/policytest"
)

// FuzzBoundedTarball reads arbitrary bytes as a bundle file and as a bundle download, within
// smallLimits: no input panics, no file, total or count passes its bound (readTarball checks
// them), and the reader of a download gets no more than the total and flate's window. The
// seeds in testdata/fuzz/FuzzBoundedTarball are tar and gzip shapes: headers that claim 2^62
// and 2^40 bytes, or less than follows, many entries, deep and long paths, zip bombs, a valid
// bundle, truncated and multi-member streams.
func FuzzBoundedTarball(f *testing.F) {
	f.Add(policytest.LyingBundle(f, 1<<62))
	f.Add(policytest.LyingBundle(f, 1<<40))
	f.Add(policytest.ManyEntriesBundle(f, 20))
	f.Add(tarWith(f, []tarFile{{deepName(40), "{}"}, {"a/data.json", `{"x": 1}`}}, nil))
	f.Add(tarWith(f, []tarFile{{"p.rego", "package p\n\nx := 1\n"}}, []byte("trailing bytes that are not a tar header")))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = readTarball(t, data, smallLimits)

		_, _ = bundle.NewCustomReader(newBoundedTarball(bytes.NewReader(data), "fuzz", smallLimits)).
			WithSkipBundleVerification(true).
			WithProcessAnnotations(true).
			WithRegoVersion(ast.RegoV1).
			WithSizeLimitBytes(smallLimits.entryBytes).
			Read()

		const window = 32 << 10
		body := newScannedBody(io.NopCloser(bytes.NewReader(data)), smallLimits)
		if zr, err := gzip.NewReader(body); err == nil {
			n, _ := io.Copy(io.Discard, io.LimitReader(zr, smallLimits.totalBytes+window+1))
			if n > smallLimits.totalBytes+window {
				t.Fatalf("the download's reader got %d decompressed bytes, over %d and the window", n, smallLimits.totalBytes)
			}
		}
		if err := body.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
