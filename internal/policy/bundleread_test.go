package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestFileBundleWithLyingHeaderRefused: a bundle file whose tar header claims 2^62 or 2^40
// bytes (94 bytes on disk) is refused with POLICY_BUNDLE_LOAD, at start and on reload, with
// and without a verification key; the active policy stays.
func TestFileBundleWithLyingHeaderRefused(t *testing.T) {
	a, _ := policytest.Keys(t)
	for _, claim := range []struct {
		name string
		size int64
	}{{"2^62", 1 << 62}, {"2^40", 1 << 40}} {
		for _, signed := range []bool{false, true} {
			name := claim.name + "/unsigned source"
			if signed {
				name = claim.name + "/verifying source"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "bundle.tar.gz")
				cfg := Config{Bundle: path}
				spec := policytest.BundleSpec{Revision: "good"}
				if signed {
					cfg.VerificationKey = testutil.WriteFile(t, dir, "key.pem", a.Public)
					spec.Sign = policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID}
				}
				lying := policytest.LyingBundle(t, claim.size)
				t.Logf("crafted bundle: %d bytes, header claims %d", len(lying), claim.size)

				// At start: refused, no policy.
				require.NoError(t, os.WriteFile(path, lying, 0o600))
				eng := decision.New(decision.Options{})
				src, err := New(cfg, eng, Options{})
				require.NoError(t, err)
				err = src.Start(t.Context())
				requireBundleLoadError(t, err, "data.json")
				assert.Empty(t, eng.Revision())
				src.Close(t.Context())

				// On reload (SIGHUP, --watch): refused, the active policy stays.
				require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, spec), 0o600))
				eng = decision.New(decision.Options{})
				src, err = New(cfg, eng, Options{})
				require.NoError(t, err)
				require.NoError(t, src.Start(t.Context()))
				defer src.Close(t.Context())
				require.NoError(t, os.WriteFile(path, lying, 0o600))
				requireBundleLoadError(t, src.Reload(t.Context()), "data.json")
				assert.Equal(t, "good", decideRevision(t, eng))
				assert.Contains(t, src.Status().LastError, "data.json")
			})
		}
	}
}

func requireBundleLoadError(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	t.Logf("refused: %v", err)
	var ce *coded.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, coded.PolicyBundleLoad, ce.Code)
	assert.Contains(t, err.Error(), want)
}

// smallLimits are the bounds of the reader tests and the fuzz target.
var smallLimits = bundleLimits{entryBytes: 4 << 10, totalBytes: 16 << 10, entries: 16}

// readTarball reads every file of a gzipped tar with a bounded loader, checking that no file,
// no total and no count passed lim: the sizes of the files read, or the loader's error.
func readTarball(tb testing.TB, data []byte, lim bundleLimits) (map[string]int, error) {
	tb.Helper()
	l := newBoundedTarball(bytes.NewReader(data), "", lim)
	files := map[string]int{}
	var total int64
	for {
		d, err := l.NextFile()
		if err == io.EOF { //nolint:errorlint // the loader's own end of the bundle only: a wrapped io.EOF is a refusal
			break
		}
		if err != nil {
			return files, err
		}
		var buf bytes.Buffer
		n, err := d.Read(&buf, lim.entryBytes+2)
		if err != nil && err != io.EOF { //nolint:errorlint // as above
			tb.Fatalf("read %s: %v", d.Path(), err)
		}
		if n > lim.entryBytes {
			tb.Fatalf("%s: %d bytes, over the bound of one file %d", d.Path(), n, lim.entryBytes)
		}
		total += n
		files[d.Path()] = int(n)
	}
	if total > lim.totalBytes || l.s.read > lim.totalBytes+1 || len(files) > lim.entries {
		tb.Fatalf("bounds passed: %d files, %d bytes of files, %d decompressed", len(files), total, l.s.read)
	}
	return files, nil
}

// deepName is a path of depth levels.
func deepName(depth int) string {
	return strings.Repeat("d/", depth-1) + "data.json"
}

// tarWith is a gzipped tar of the given headers and contents, then raw bytes after the tar
// writer's last entry (no end-of-archive blocks when raw is not nil).
func tarWith(tb testing.TB, files []tarFile, raw []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	gw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gw)
	for _, f := range files {
		require.NoError(tb, tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o600, Size: int64(len(f.body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(f.body))
		require.NoError(tb, err)
	}
	if raw != nil {
		require.NoError(tb, tw.Flush())
		_, err := gw.Write(raw)
		require.NoError(tb, err)
	} else {
		require.NoError(tb, tw.Close())
	}
	require.NoError(tb, gw.Close())
	return buf.Bytes()
}

type tarFile struct{ name, body string }

// TestBoundedTarballShapes reads archives of every shape the bounds exist for, and some
// merely broken ones: each is refused with the bound it passes, or read within the bounds.
func TestBoundedTarballShapes(t *testing.T) {
	truncated := tarWith(t, []tarFile{{"a.json", strings.Repeat("0123456789abcdef", 200)}}, nil)
	for _, tc := range []struct {
		name  string
		data  []byte
		want  string // "" when read
		files int
	}{
		{"within bounds", policytest.BombBundle(t, policytest.BombEntry{Name: "a.json", Size: 1000}, policytest.BombEntry{Name: "b/c.json", Size: 4 << 10}), "", 2},
		{"header claims 2^62", policytest.LyingBundle(t, 1<<62), "its header announces 4611686018427387904 bytes", 0},
		{"header claims 2^40", policytest.LyingBundle(t, 1<<40), "its header announces 1099511627776 bytes", 0},
		{"header claims less than follows", tarWith(t, []tarFile{{"a.json", "0123456789"}}, bytes.Repeat([]byte("a"), 1024)), "archive read failed", 1},
		{"one file over its bound", policytest.BombBundle(t, policytest.BombEntry{Name: "a.json", Size: 4<<10 + 1}), "more than the 4096 bytes one file may hold", 0},
		{"total over its bound", policytest.BombBundle(t, policytest.BombEntry{Name: "a", Size: 4 << 10}, policytest.BombEntry{Name: "b", Size: 4 << 10},
			policytest.BombEntry{Name: "c", Size: 4 << 10}, policytest.BombEntry{Name: "d", Size: 4 << 10}), "more than 16384 bytes decompressed", 3},
		{"many entries", policytest.ManyEntriesBundle(t, 17), "more than 16 entries", 16},
		{"deep path", tarWith(t, []tarFile{{deepName(33), "{}"}}, nil), "33 levels deep", 0},
		{"long path", tarWith(t, []tarFile{{strings.Repeat("x", 1025), "{}"}}, nil), "1025 bytes long", 0},
		{"truncated", truncated[:len(truncated)-12], "unexpected EOF", -1},
		{"not gzip", []byte("not a bundle"), "archive read failed", 0},
		{"empty", nil, "archive read failed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := readTarball(t, tc.data, smallLimits)
			if tc.files >= 0 {
				assert.Len(t, files, tc.files)
			}
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestBoundedDirectory: a bundle directory is refused past the bound of one file, of the
// total and of the number of files; within them it is read as OPA reads it.
func TestBoundedDirectory(t *testing.T) {
	lim := bundleLimits{entryBytes: 64 << 10, totalBytes: 96 << 10, entries: 8}
	write := func(t *testing.T, files map[string]int) string {
		dir := filepath.Join(t.TempDir(), "bundle")
		policytest.WriteBundleDir(t, dir, policytest.BundleSpec{Revision: "dir"})
		for name, size := range files {
			testutil.WriteFile(t, dir, name, `"`+strings.Repeat("x", size-2)+`"`)
		}
		return dir
	}
	for _, tc := range []struct {
		name  string
		files map[string]int
		want  string
	}{
		{"within bounds", map[string]int{"a/data.json": 32 << 10}, ""},
		{"one file over its bound", map[string]int{"a/data.json": 64<<10 + 1}, "a/data.json"},
		{"total over its bound", map[string]int{"a/data.json": 60 << 10, "b/data.json": 60 << 10}, "more than 98304 bytes in all"},
		{"many files", map[string]int{"a/data.json": 2, "b/data.json": 2, "c/data.json": 2, "d/data.json": 2, "e/data.json": 2, "f/data.json": 2, "g/data.json": 2, "h/data.json": 2}, "more than 8 files"},
		{"deep path", map[string]int{deepName(33): 2}, "33 levels deep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := readBundleWithin(write(t, tc.files), nil, lim)
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, "dir", b.Manifest.Revision)
				assert.NotEmpty(t, b.Modules)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestScannedBodyHandsOverOnlyCheckedBytes: the body of a bundle download is handed to its
// reader only as far as the scanner found it within the bounds: a bomb's reader gets an error
// after no more decompressed bytes than the total bound and flate's window (the scanner's
// decompressor fills its 32 KiB window before the tar reader sees it), and a valid bundle
// arrives whole.
func TestScannedBodyHandsOverOnlyCheckedBytes(t *testing.T) {
	const window = 32 << 10
	valid := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "r"})
	bomb := policytest.BombBundle(t, policytest.BombEntry{Name: "a", Size: 4 << 10}, policytest.BombEntry{Name: "b", Size: 4 << 10},
		policytest.BombEntry{Name: "c", Size: 4 << 10}, policytest.BombEntry{Name: "d", Size: 4 << 10}, policytest.BombEntry{Name: "e", Size: 64 << 20})
	many := make([]policytest.BombEntry, 64)
	for i := range many {
		many[i] = policytest.BombEntry{Name: fmt.Sprintf("e%d", i), Size: 4 << 20}
	}
	for _, tc := range []struct {
		name string
		data []byte
		lim  bundleLimits
		want string
	}{
		{"valid bundle", valid, defaultBundleLimits(), ""},
		{"bomb", bomb, smallLimits, "more than 16384 bytes decompressed"},
		{"lying header", policytest.LyingBundle(t, 1<<62), smallLimits, "its header announces"},
		{"256 MiB in 4 MiB files", policytest.BombBundle(t, many...), defaultBundleLimits(), "more than 8388608 bytes decompressed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := newScannedBody(io.NopCloser(iotest.HalfReader(bytes.NewReader(tc.data))), tc.lim)
			zr, err := gzip.NewReader(body)
			var got int64
			if err == nil {
				got, err = io.Copy(io.Discard, zr)
			}
			require.NoError(t, body.Close())
			t.Logf("the reader decompressed %d bytes, then: %v", got, err)
			assert.LessOrEqual(t, got, tc.lim.totalBytes+window)
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, policytest.Gunzipped(t, tc.data), got)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
