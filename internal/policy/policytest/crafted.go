package policytest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// LyingBundle is a gzipped tar whose one entry, authz/lying/data.json, claims claim bytes in
// its (GNU) header and holds none: the archive ends after the header. It is 94 bytes.
func LyingBundle(tb testing.TB, claim int64) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(tb, err)
	tw := tar.NewWriter(gw)
	require.NoError(tb, tw.WriteHeader(&tar.Header{Name: "authz/lying/data.json", Mode: 0o600, Size: claim, Typeflag: tar.TypeReg, Format: tar.FormatGNU}))
	// No Close: the content the header announces is missing, and the archive ends here.
	require.NoError(tb, gw.Close())
	return buf.Bytes()
}

// BombEntry is one entry of a BombBundle: name holds size zero bytes.
type BombEntry struct {
	Name string
	Size int64
}

// BombBundle is a gzipped tar of entries made of zero bytes, whose headers tell their true
// sizes: hundreds of MiB in about a thousandth of their size. It is a stream of gzip members
// (as gzip readers read by default), one compressed MiB of zeros repeated, so that building a
// GiB costs no more than compressing one MiB.
func BombBundle(tb testing.TB, entries ...BombEntry) []byte {
	tb.Helper()
	zeros := make([]byte, 1<<20)
	mib := gzipped(tb, zeros)
	var buf bytes.Buffer
	for _, e := range entries {
		var hdr bytes.Buffer
		require.NoError(tb, tar.NewWriter(&hdr).WriteHeader(&tar.Header{Name: e.Name, Mode: 0o600, Size: e.Size, Typeflag: tar.TypeReg}))
		buf.Write(gzipped(tb, hdr.Bytes()))
		for range e.Size >> 20 {
			buf.Write(mib)
		}
		if rest := e.Size%(1<<20) + (512-e.Size%512)%512; rest > 0 { // the rest, and the padding to a block
			buf.Write(gzipped(tb, make([]byte, rest)))
		}
	}
	buf.Write(gzipped(tb, zeros[:1024])) // the end of the archive
	return buf.Bytes()
}

// gzipped is one gzip member holding b.
func gzipped(tb testing.TB, b []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(tb, err)
	_, err = gw.Write(b)
	require.NoError(tb, err)
	require.NoError(tb, gw.Close())
	return buf.Bytes()
}

// ManyEntriesBundle is a gzipped tar of n empty entries named e0.json, e1.json, ….
func ManyEntriesBundle(tb testing.TB, n int) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gw)
	for i := range n {
		require.NoError(tb, tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("e%d.json", i), Mode: 0o600, Typeflag: tar.TypeReg}))
	}
	require.NoError(tb, tw.Close())
	require.NoError(tb, gw.Close())
	return buf.Bytes()
}

// Gunzipped is the decompressed size of a gzip stream.
func Gunzipped(tb testing.TB, gz []byte) int64 {
	tb.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	require.NoError(tb, err)
	n, err := io.Copy(io.Discard, zr)
	require.NoError(tb, err)
	return n
}
