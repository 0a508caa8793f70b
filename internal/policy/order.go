package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// Rollback protection. OPA verifies a bundle's signature but does not order bundles: a bundle
// server may serve an older, validly signed bundle and OPA activates it. authz orders signed
// bundles by the issue time of their signature (the JWT's iat claim, set with
// `opa build --claims-file`): a bundle issued before the active one, or without an iat while the
// active one has one, is refused with POLICY_BUNDLE_ROLLBACK. A deliberate rollback signs the
// old content again, with a newer iat.

// bundleOrder is the issue time of each active signed bundle, by bundle name. With a state
// file, it is read at start and written after each activation, so that the order holds across
// restarts; without one it holds for the life of the process.
type bundleOrder struct {
	state string // the state file; "" when the order is kept in the process only
	iat   map[string]int64
}

// orderStateName is the state file, in OPA's persistence directory.
const orderStateName = "authz-bundle-order.json"

// loadOrder reads the state file at path ("" for none). A missing file is an empty order; an
// unreadable or malformed one is an error: the service must not start without the order it
// recorded.
func loadOrder(path string) (*bundleOrder, error) {
	o := &bundleOrder{state: path, iat: map[string]int64{}}
	if path == "" {
		return o, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return o, nil
	}
	if err == nil {
		var st struct {
			IssuedAt map[string]int64 `json:"issued_at"`
		}
		if err = json.Unmarshal(b, &st); err == nil {
			for n, t := range st.IssuedAt {
				o.iat[n] = t
			}
			return o, nil
		}
	}
	return nil, fmt.Errorf("the order of signed bundles (%s): %w: restore or remove the file (removing it accepts any validly signed bundle once)", path, err)
}

// check says whether a bundle issued at iat (0: no iat claim) may replace the active bundle of
// that name; a refusal is a POLICY_BUNDLE_ROLLBACK.
func (o *bundleOrder) check(name string, iat int64) error {
	active := o.iat[name]
	switch {
	case active == 0:
		return nil
	case iat == 0:
		return fmt.Errorf("bundle %s: its signature has no iat claim, and the active bundle was issued at %s: sign bundles with an issue time (opa build --claims-file with an \"iat\" claim)", name, issueTime(active))
	case iat < active:
		return fmt.Errorf("bundle %s: issued at %s, before the active bundle (issued at %s): refused as a rollback; to roll back on purpose, sign the old content again with a newer iat", name, issueTime(iat), issueTime(active))
	}
	return nil
}

// commit records the issue times of newly activated bundles and writes the state file.
func (o *bundleOrder) commit(iats map[string]int64) error {
	changed := false
	for n, t := range iats {
		if t != 0 && t != o.iat[n] {
			o.iat[n], changed = t, true
		}
	}
	if !changed || o.state == "" {
		return nil
	}
	b, err := json.Marshal(map[string]any{"issued_at": o.iat})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.state), 0o700); err != nil {
		return err
	}
	tmp := o.state + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, o.state)
}

func issueTime(iat int64) string { return time.Unix(iat, 0).UTC().Format(time.RFC3339) }

// signatureIAT is the iat claim of a bundle's signature (verified by OPA before it gets here);
// 0 when the bundle is unsigned or its signature has no iat.
func signatureIAT(sc bundle.SignaturesConfig) (int64, error) {
	if len(sc.Signatures) == 0 {
		return 0, nil
	}
	parts := strings.Split(sc.Signatures[0], ".")
	if len(parts) != 3 {
		return 0, errors.New(".signatures.json: the signature is not a compact JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return 0, fmt.Errorf(".signatures.json: %w", err)
	}
	var ds bundle.DecodedSignature
	if err := json.Unmarshal(payload, &ds); err != nil {
		return 0, fmt.Errorf(".signatures.json: the claims: %w", err)
	}
	return ds.IssuedAt, nil
}

// maxSmallEntry bounds what is read of a persisted bundle's .manifest and .signatures.json.
const maxSmallEntry = 1 << 20

// persistedSignature reads the signatures and the manifest's revision of the bundle OPA
// persisted for name under dir (OPA's persistence directory), the bundle it has just activated.
func persistedSignature(dir, name string) (bundle.SignaturesConfig, string, error) {
	var sc bundle.SignaturesConfig
	f, err := os.Open(filepath.Join(dir, "bundles", name, "bundle.tar.gz"))
	if err != nil {
		return sc, "", err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return sc, "", err
	}
	tr := tar.NewReader(zr)
	var revision string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return sc, revision, nil
		}
		if err != nil {
			return sc, "", err
		}
		switch strings.TrimPrefix(h.Name, "/") {
		case ".signatures.json":
			b, err := readSmall(tr)
			if err == nil {
				err = json.Unmarshal(b, &sc)
			}
			if err != nil {
				return sc, "", fmt.Errorf(".signatures.json: %w", err)
			}
		case ".manifest":
			var m bundle.Manifest
			b, err := readSmall(tr)
			if err == nil {
				err = json.Unmarshal(b, &m)
			}
			if err != nil {
				return sc, "", fmt.Errorf(".manifest: %w", err)
			}
			revision = m.Revision
		}
	}
}

func readSmall(r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, maxSmallEntry+1))
	if err != nil {
		return nil, err
	}
	if n > maxSmallEntry {
		return nil, fmt.Errorf("over %d bytes", maxSmallEntry)
	}
	return buf.Bytes(), nil
}

// BundleOrder is the order of signed bundles for a gate that activates bundles itself (the gate
// of `authz run`, internal/opaplugin): the same rules and state file as authz serve's. It is
// not safe for concurrent use.
type BundleOrder struct{ o *bundleOrder }

// LoadBundleOrder reads the order kept in persistDir (OPA's persistence directory; "" keeps
// the order in the process only). A malformed state file is an error: do not start without it.
func LoadBundleOrder(persistDir string) (*BundleOrder, error) {
	state := ""
	if persistDir != "" {
		state = filepath.Join(persistDir, orderStateName)
	}
	o, err := loadOrder(state)
	if err != nil {
		return nil, err
	}
	return &BundleOrder{o: o}, nil
}

// Check says whether bundle name, issued at iat (0: none), may replace the one adopted; its
// error is a POLICY_BUNDLE_ROLLBACK naming both issue times.
func (b *BundleOrder) Check(name string, iat int64) error { return b.o.check(name, iat) }

// Commit records the issue times of adopted bundles (0: not signed, not recorded) and writes
// the state file.
func (b *BundleOrder) Commit(iats map[string]int64) error { return b.o.commit(iats) }

// SignatureIAT is the iat claim of a verified bundle's signature; 0 when it has none.
func SignatureIAT(sc bundle.SignaturesConfig) (int64, error) { return signatureIAT(sc) }
