package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader/filter"

	"github.com/authz-dev/authz/internal/policystate"
)

// Bounds of reading one bundle, from a file, a directory or a bundle server. They are checked
// on the bytes as they arrive (decompressed), never on what a tar header claims: a header may
// only make a bundle be refused earlier, never make memory be allocated. A bundle beyond any of
// them is refused with an error naming the bound.
//
// OPA's own tarball reader (bundle.NewTarballLoaderWithBaseURL) sizes its buffer of an entry
// from the entry's header, so a 94-byte bundle whose header claims 2^62 bytes panics in it, and
// it bounds neither the number of entries nor their total. authz therefore reads bundle files
// with its own tarball loader (boundedTarball) and bundle directories through OPA's directory
// loader wrapped in boundedFiles, both handed to OPA's bundle.NewCustomReader, which then
// parses, verifies and assembles the bundle as `opa run --bundle` does. Remote bundles are read
// by OPA's downloader; their stream is checked before OPA reads it (remotebound.go).
const (
	// DefaultBundleEntryBytes bounds one file of a bundle, decompressed; DefaultBundleTotalBytes
	// bounds a whole bundle (policystate).
	DefaultBundleEntryBytes = policystate.DefaultBundleEntryBytes
	DefaultBundleTotalBytes = policystate.DefaultBundleTotalBytes
	// DefaultBundleEntries bounds the entries of a bundle (for a tarball, every tar header,
	// directories included).
	DefaultBundleEntries = 1024
	// BundleReadBytes is the most a bundle being read holds before its signature is checked,
	// with the default bounds (policystate).
	BundleReadBytes = policystate.BundleReadBytes
	// maxBundlePathBytes and maxBundlePathDepth bound an entry's name: its path in the bundle
	// becomes nested objects of the data document.
	maxBundlePathBytes = 1024
	maxBundlePathDepth = 32
)

// bundleLimits bound reading one bundle.
type bundleLimits struct {
	entryBytes, totalBytes int64
	entries                int
	// regoBytes bounds the .rego files of a download of a bundle other than the gate's (0:
	// none); regoKey is the key that sets it (bundlecost.go).
	regoBytes int64
	regoKey   string
}

func defaultBundleLimits() bundleLimits {
	return bundleLimits{entryBytes: DefaultBundleEntryBytes, totalBytes: DefaultBundleTotalBytes, entries: DefaultBundleEntries}
}

// withEntryLimit is l with the bound of one entry set to n (OPA's size_limit_bytes) when n is
// positive; the total is raised to n when it was lower, so that one entry of that size fits.
func (l bundleLimits) withEntryLimit(n int64) bundleLimits {
	if n > 0 {
		l.entryBytes = n
		l.totalBytes = max(l.totalBytes, n)
	}
	return l
}

// errBundleBound is the cause of every refusal by a bound.
var errBundleBound = errors.New(`beyond the bounds of a bundle: build a smaller bundle, or for remote bundles raise the bundle's size_limit_bytes (docs/service.md, "Limits and memory")`)

func boundError(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), errBundleBound)
}

// readBundle reads a bundle file or directory as `opa run --bundle` does, within the default
// bounds, verifying its signature with vc when vc is not nil (every file must be covered by the
// signature).
func readBundle(path string, vc *bundle.VerificationConfig) (*bundle.Bundle, error) {
	return readBundleWithin(path, vc, defaultBundleLimits())
}

func readBundleWithin(path string, vc *bundle.VerificationConfig, lim bundleLimits) (*bundle.Bundle, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var dl bundle.DirectoryLoader
	if fi.IsDir() {
		dl = &boundedFiles{inner: bundle.NewDirectoryLoader(path).WithSizeLimitBytes(lim.entryBytes), root: path, lim: lim}
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		dl = newBoundedTarball(f, path, lim)
	}
	r := bundle.NewCustomReader(dl).
		WithProcessAnnotations(true).
		WithRegoVersion(ast.RegoV1).
		WithSizeLimitBytes(lim.entryBytes).
		WithLazyLoadingMode(false).
		WithBundleName(path)
	if vc != nil {
		r = r.WithBundleVerificationConfig(vc)
	} else {
		r = r.WithSkipBundleVerification(true)
	}
	if fi.IsDir() {
		// Module names carry the directory, as `opa run` shows them.
		r = r.WithBaseDir(path)
	}
	b, err := r.Read()
	if err != nil {
		return nil, explainNoKeyID(err, vc)
	}
	return &b, nil
}

// explainNoKeyID says what OPA's "verification key ID is empty" means and what to do: the
// signature names no key, most often because `opa build --claims-file` replaced the payload
// that --verification-key-id would have written its keyid into.
func explainNoKeyID(err error, vc *bundle.VerificationConfig) error {
	if vc == nil || !strings.Contains(err.Error(), "verification key ID is empty") {
		return err
	}
	ids := slices.Sorted(maps.Keys(vc.PublicKeys))
	return fmt.Errorf("%w: the bundle's signature names no key (no \"kid\" in its header, no \"keyid\" claim), and it must name %s: "+
		"add \"keyid\": %q to the claims file of `opa build --claims-file` (the file replaces the claims opa build writes, keyid included) and build the bundle again",
		err, strings.Join(ids, " or "), ids[0])
}

// tarScanner reads the entries of a gzipped tar within bounds: the decompressed stream,
// headers and padding included, is counted as it is read, and an entry is read only into what
// arrives.
type tarScanner struct {
	lim     bundleLimits
	gz      *gzip.Reader
	tr      *tar.Reader
	read    int64 // decompressed bytes read so far
	entries int
	rego    int64 // bytes of .rego files announced so far
	err     error // sticky
}

func newTarScanner(r io.Reader, lim bundleLimits) *tarScanner {
	s := &tarScanner{lim: lim}
	gz, err := gzip.NewReader(r)
	if err != nil {
		s.err = fmt.Errorf("archive read failed: %w", err)
		return s
	}
	s.gz = gz
	s.tr = tar.NewReader(s)
	return s
}

// Read is the decompressed stream, counted against the total bound.
func (s *tarScanner) Read(p []byte) (int, error) {
	if left := s.lim.totalBytes - s.read; int64(len(p)) > left+1 {
		p = p[:left+1]
	}
	n, err := s.gz.Read(p)
	s.read += int64(n)
	if s.read > s.lim.totalBytes {
		return n, boundError("more than %d bytes decompressed", s.lim.totalBytes)
	}
	return n, err
}

// next returns the next regular file and its content, read within the bounds, or io.EOF at
// the end of the archive. content receives the file; it is io.Discard to only check.
func (s *tarScanner) next(content io.Writer) (*tar.Header, error) {
	if s.err != nil {
		return nil, s.err
	}
	for {
		h, err := s.tr.Next()
		if err == io.EOF { //nolint:errorlint // only tar's own end of archive ends it: a read error that wraps io.EOF (a stream cut short) does not
			// The rest of the stream (tar's end blocks, gzip's trailer) is read, and checked.
			if _, err = io.Copy(io.Discard, s); err == nil {
				return nil, s.fail(io.EOF)
			}
		}
		if err != nil {
			if errors.Is(err, errBundleBound) {
				return nil, s.fail(err)
			}
			return nil, s.fail(fmt.Errorf("archive read failed: %w", err))
		}
		if s.entries++; s.entries > s.lim.entries {
			return nil, s.fail(boundError("more than %d entries", s.lim.entries))
		}
		if err := checkEntryName(h.Name); err != nil {
			return nil, s.fail(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if s.lim.regoBytes > 0 && strings.HasSuffix(h.Name, bundle.RegoExt) {
			if s.rego += h.Size; s.rego > s.lim.regoBytes {
				return nil, s.fail(fmt.Errorf("%w: its .rego files announce more than %d bytes (%s): shrink it, or raise %s", errRegoBound, s.lim.regoBytes, h.Name, s.lim.regoKey))
			}
		}
		if h.Size > s.lim.entryBytes {
			return nil, s.fail(boundError("%s: its header announces %d bytes, more than the %d bytes one file may hold", h.Name, h.Size, s.lim.entryBytes))
		}
		n, err := io.Copy(content, io.LimitReader(s.tr, s.lim.entryBytes+1))
		switch {
		case errors.Is(err, errBundleBound):
			return nil, s.fail(err)
		case err != nil:
			return nil, s.fail(fmt.Errorf("failed to copy file %s: %w", h.Name, err))
		case n > s.lim.entryBytes:
			return nil, s.fail(boundError("%s: more than the %d bytes one file may hold", h.Name, s.lim.entryBytes))
		}
		return h, nil
	}
}

func (s *tarScanner) fail(err error) error {
	s.err = err
	return err
}

// checkEntryName bounds the length and depth of an entry's path.
func checkEntryName(name string) error {
	if len(name) > maxBundlePathBytes {
		return boundError("an entry's path is %d bytes long, more than %d", len(name), maxBundlePathBytes)
	}
	if d := strings.Count(strings.Trim(filepath.ToSlash(name), "/"), "/") + 1; d > maxBundlePathDepth {
		return boundError("%s: %d levels deep, more than %d", name, d, maxBundlePathDepth)
	}
	return nil
}

// boundedTarball is a bundle.DirectoryLoader of a gzipped tar, read one entry at a time
// within bounds.
type boundedTarball struct {
	s       *tarScanner
	baseURL string
	filter  filter.LoaderFilter
	format  bundle.PathFormat
}

var _ bundle.DirectoryLoader = (*boundedTarball)(nil)

func newBoundedTarball(r io.Reader, baseURL string, lim bundleLimits) *boundedTarball {
	return &boundedTarball{s: newTarScanner(r, lim), baseURL: strings.TrimSuffix(baseURL, "/"), format: bundle.Passthrough}
}

// NextFile returns the next regular file of the archive, io.EOF after the last.
func (t *boundedTarball) NextFile() (*bundle.Descriptor, error) {
	for {
		var buf bytes.Buffer
		h, err := t.s.next(&buf)
		if err != nil {
			return nil, err
		}
		name := filepath.ToSlash(h.Name)
		if t.filter != nil && t.filter(name, h.FileInfo(), strings.Count(strings.Trim(name, "/"), "/")+1) {
			continue
		}
		p := name
		switch t.format {
		case bundle.SlashRooted:
			p = "/" + strings.TrimPrefix(name, "/")
		case bundle.Chrooted:
			p = strings.TrimPrefix(name, "/")
		}
		return bundle.NewDescriptor(filepath.Join(t.baseURL, p), p, &buf), nil
	}
}

func (t *boundedTarball) WithFilter(f filter.LoaderFilter) bundle.DirectoryLoader {
	t.filter = f
	return t
}

func (t *boundedTarball) WithPathFormat(f bundle.PathFormat) bundle.DirectoryLoader {
	t.format = f
	return t
}

// WithSizeLimitBytes lowers the bound of one entry to n (never raises it).
func (t *boundedTarball) WithSizeLimitBytes(n int64) bundle.DirectoryLoader {
	if n > 0 && n < t.s.lim.entryBytes {
		t.s.lim.entryBytes = n
	}
	return t
}

func (t *boundedTarball) WithFollowSymlinks(bool) bundle.DirectoryLoader { return t }

// boundedFiles bounds another DirectoryLoader (OPA's directory loader): it reads each file
// into memory within the bound of one entry and of what is left of the total, and counts the
// files. OPA's directory loader refuses a file larger than its size limit from the file's size
// on disk, before reading it.
type boundedFiles struct {
	inner   bundle.DirectoryLoader
	root    string // the directory, which the paths of its files start with
	lim     bundleLimits
	read    int64
	entries int
}

var _ bundle.DirectoryLoader = (*boundedFiles)(nil)

func (b *boundedFiles) NextFile() (*bundle.Descriptor, error) {
	d, err := b.inner.NextFile()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if b.entries++; b.entries > b.lim.entries {
		return nil, boundError("more than %d files", b.lim.entries)
	}
	if err := checkEntryName(strings.TrimPrefix(filepath.ToSlash(d.Path()), filepath.ToSlash(b.root))); err != nil {
		return nil, err
	}
	limit := min(b.lim.entryBytes, b.lim.totalBytes-b.read)
	var buf bytes.Buffer
	n, err := d.Read(&buf, limit+1)
	b.read += n
	if err != nil && err != io.EOF { //nolint:errorlint // a descriptor's own end of file only
		return nil, fmt.Errorf("failed to read %s: %w", d.Path(), err)
	}
	if n > b.lim.entryBytes {
		return nil, boundError("%s: more than the %d bytes one file may hold", d.Path(), b.lim.entryBytes)
	}
	if n > limit {
		return nil, boundError("more than %d bytes in all", b.lim.totalBytes)
	}
	return bundle.NewDescriptor(d.URL(), d.Path(), &buf), nil
}

func (b *boundedFiles) WithFilter(f filter.LoaderFilter) bundle.DirectoryLoader {
	b.inner = b.inner.WithFilter(f)
	return b
}

func (b *boundedFiles) WithPathFormat(f bundle.PathFormat) bundle.DirectoryLoader {
	b.inner = b.inner.WithPathFormat(f)
	return b
}

// WithSizeLimitBytes lowers the bound of one file to n (never raises it).
func (b *boundedFiles) WithSizeLimitBytes(n int64) bundle.DirectoryLoader {
	if n > 0 && n < b.lim.entryBytes {
		b.lim.entryBytes = n
	}
	b.inner = b.inner.WithSizeLimitBytes(b.lim.entryBytes)
	return b
}

func (b *boundedFiles) WithFollowSymlinks(yes bool) bundle.DirectoryLoader {
	b.inner = b.inner.WithFollowSymlinks(yes)
	return b
}
