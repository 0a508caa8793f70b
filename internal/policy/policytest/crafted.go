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

// BombBundle is a gzipped tar of entries made of zero bytes: a few hundred MiB compress to
// about a thousandth of their size. Each entry's header tells its true size.
func BombBundle(tb testing.TB, entries ...BombEntry) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	require.NoError(tb, err)
	tw := tar.NewWriter(gw)
	zeros := make([]byte, 1<<20)
	for _, e := range entries {
		require.NoError(tb, tw.WriteHeader(&tar.Header{Name: e.Name, Mode: 0o600, Size: e.Size, Typeflag: tar.TypeReg}))
		for left := e.Size; left > 0; {
			n := min(left, int64(len(zeros)))
			_, err := tw.Write(zeros[:n])
			require.NoError(tb, err)
			left -= n
		}
	}
	require.NoError(tb, tw.Close())
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
