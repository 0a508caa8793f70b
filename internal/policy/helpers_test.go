package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/policies"
)

// keyPair is an RSA key: its private PEM signs bundles, its public PEM file verifies them.
type keyPair struct {
	private string
	public  string
}

var (
	keysOnce sync.Once
	keyA     keyPair
	keyB     keyPair
)

func testKeys(tb testing.TB) (a, b keyPair) {
	tb.Helper()
	keysOnce.Do(func() {
		keyA, keyB = newKeyPair(tb), newKeyPair(tb)
	})
	return keyA, keyB
}

func newKeyPair(tb testing.TB) keyPair {
	tb.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(tb, err)
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(tb, err)
	return keyPair{
		private: string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})),
		public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
}

// writeFile writes content to a new file in dir and returns its path.
func writeFile(tb testing.TB, dir, name, content string) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	require.NoError(tb, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(tb, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// signing says how a test bundle is signed; the zero value leaves it unsigned.
type signing struct {
	key   string // private PEM; "" for unsigned
	alg   string // RS256 when empty
	keyID string // the JWT's kid; "" for none
	scope string // the scope claim
}

// bundleSpec describes a test bundle.
type bundleSpec struct {
	revision string
	modules  map[string]string // path → source; the embedded policy when nil
	data     map[string]any
	sign     signing
	// after signing: tamper replaces a module's source, extra adds a module.
	tamper map[string]string
	extra  map[string]string
}

// embeddedModules is the shipped policy, the modules of a working bundle.
func embeddedModules(tb testing.TB) map[string]string {
	tb.Helper()
	mods, err := policies.Modules()
	require.NoError(tb, err)
	out := map[string]string{}
	for p, src := range mods {
		out[strings.TrimPrefix(p, "policies/")] = src
	}
	return out
}

// makeBundle builds the bundle of spec as OPA's bundle writer (`opa build`) writes it: a
// .tar.gz with data.json, the modules, .manifest and, when signed, .signatures.json.
func makeBundle(tb testing.TB, spec bundleSpec) []byte {
	tb.Helper()
	mods := spec.modules
	if mods == nil {
		mods = embeddedModules(tb)
	}
	b := bundle.Bundle{Manifest: bundle.Manifest{Revision: spec.revision}, Data: spec.data}
	if b.Data == nil {
		b.Data = map[string]any{}
	}
	add := func(path, src string) {
		m, _ := ast.ParseModuleWithOpts(path, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		b.Modules = append(b.Modules, bundle.ModuleFile{URL: "/" + path, Path: "/" + path, Raw: []byte(src), Parsed: m})
	}
	for p, src := range mods {
		add(p, src)
	}
	if spec.sign.key != "" {
		alg := spec.sign.alg
		if alg == "" {
			alg = "RS256"
		}
		claims := ""
		if spec.sign.scope != "" {
			claims = writeFile(tb, tb.TempDir(), "claims.json", fmt.Sprintf(`{"scope": %q}`, spec.sign.scope))
		}
		require.NoError(tb, b.GenerateSignature(bundle.NewSigningConfig(spec.sign.key, alg, claims), spec.sign.keyID, false))
	}
	for p, src := range spec.tamper {
		for i := range b.Modules {
			if b.Modules[i].Path == "/"+p {
				b.Modules[i].Raw = []byte(src)
			}
		}
	}
	for p, src := range spec.extra {
		add(p, src)
	}
	var buf bytes.Buffer
	require.NoError(tb, bundle.NewWriter(&buf).Write(b))
	return buf.Bytes()
}

// untar writes the files of a bundle .tar.gz into dir (a bundle directory).
func untar(tb testing.TB, tgz []byte, dir string) {
	tb.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	require.NoError(tb, err)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		require.NoError(tb, err)
		b, err := io.ReadAll(tr)
		require.NoError(tb, err)
		writeFile(tb, dir, strings.TrimPrefix(h.Name, "/"), string(b))
	}
}

// entrypointOnly is a policy whose decision carries its revision marker in the code, so a
// decision shows which policy made it.
func markerModules(marker string) map[string]string {
	caps := make([]string, len(decision.CapabilityKeys))
	for i, k := range decision.CapabilityKeys {
		caps[i] = strconv.Quote(k) + ": false"
	}
	return map[string]string{"authz/decision.rego": fmt.Sprintf(`package authz

decision := {"allow": false, "code": %q, "message": "marker", "reasons": ["marker"], "capabilities": {%s}}
`, marker, strings.Join(caps, ", "))}
}

// bundleServer is a loopback bundle server: it serves the published bundle with an ETag,
// answers 304 to a matching If-None-Match, and holds a long poll (Prefer: wait=N) until a new
// bundle is published or the wait ends.
type bundleServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	etag    string
	changed chan struct{}
	served  int
}

func newBundleServer(tb testing.TB) *bundleServer {
	tb.Helper()
	s := &bundleServer{changed: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.Close)
	return s
}

// publish makes body the bundle served from now on.
func (s *bundleServer) publish(body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body = body
	s.etag = fmt.Sprintf(`"%d-%d"`, time.Now().UnixNano(), len(body))
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *bundleServer) serve(w http.ResponseWriter, r *http.Request) {
	wait := 0
	for _, p := range strings.Split(r.Header.Get("Prefer"), ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(p), "wait="); ok {
			wait, _ = strconv.Atoi(v)
		}
	}
	s.mu.Lock()
	etag, body, changed := s.etag, s.body, s.changed
	s.mu.Unlock()
	if wait > 0 {
		w.Header().Set("Content-Type", "application/vnd.openpolicyagent.bundles")
	}
	if body != nil && strings.Contains(r.Header.Get("If-None-Match"), etag) && wait > 0 {
		select {
		case <-changed:
		case <-time.After(time.Duration(wait) * time.Second):
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
		etag, body = s.etag, s.body
		s.mu.Unlock()
	}
	if body == nil {
		http.Error(w, "no bundle published", http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", etag)
	if strings.Contains(r.Header.Get("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	s.mu.Lock()
	s.served++
	s.mu.Unlock()
	if wait == 0 {
		w.Header().Set("Content-Type", "application/gzip")
	}
	_, _ = w.Write(body)
}

// waitFor polls cond until it holds or the time is up.
func waitFor(tb testing.TB, what string, d time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
