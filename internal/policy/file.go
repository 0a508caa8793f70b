package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// compileBundle compiles and checks a bundle into a policy under its manifest revision (a
// digest of its content when it has none).
func compileBundle(b *bundle.Bundle) (*decision.Policy, error) {
	mods := make(map[string]*ast.Module, len(b.Modules))
	for _, m := range b.Modules {
		mods[m.Path] = m.Parsed
	}
	return decision.CompileModules(mods, b.Data, bundleRevision(b))
}

// loadFile reads the bundle file or directory and activates it; on any failure the active
// policy stays and the error is recorded in the status.
func (s *Source) loadFile(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := s.cfg.Bundle
	st := s.status.Bundles[path]
	if st == nil {
		st = &bundleplugin.Status{Name: path}
		s.status.Bundles[path] = st
	}
	st.SetRequest()
	s.watched = fingerprint(path)
	fail := func(code string, err error) error {
		e := &coded.Error{Code: code, Err: fmt.Errorf("%s: %w", path, err)}
		st.Code, st.Message, st.Errors = code, e.Err.Error(), nil
		s.status.LastError = e.Error()
		if rev := s.eng.Revision(); rev != "" {
			s.log.Error("bundle refused; the active policy stays", "bundle", path, "active_revision", rev, "error", e)
		}
		return e
	}
	b, err := readBundle(path, s.vc)
	if err != nil {
		return fail(coded.PolicyBundleLoad, err)
	}
	st.SetDownloadSuccess()
	st.Type = b.Type()
	p, err := compileBundle(b)
	if err != nil {
		return fail(coded.PolicyBundleCheck, err)
	}
	if err := s.activateLocked(ctx, p, OriginFile+":"+path); err != nil {
		return fail(coded.PolicyBundleCheck, err)
	}
	st.SetError(nil)
	st.SetActivateSuccess(p.Revision())
	return nil
}

// watch re-reads the bundle whenever its files change (names, sizes, modification times),
// looking every WatchInterval, until Close.
func (s *Source) watch(ctx context.Context) {
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		last := s.watched
		s.mu.Unlock()
		if fp := fingerprint(s.cfg.Bundle); fp != last {
			s.log.Info("bundle changed; reloading", "bundle", s.cfg.Bundle)
			_ = s.loadFile(ctx) // a failure is logged and kept in the status
		}
	}
}

// fingerprint digests the names, sizes and modification times of the files at path; a file
// that cannot be read is part of the digest as such.
func fingerprint(path string) string {
	h := sha256.New()
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		var fi fs.FileInfo
		if err == nil {
			fi, err = d.Info()
		}
		if err != nil {
			fmt.Fprintf(h, "%s:unreadable;", p)
			return nil //nolint:nilerr // an unreadable entry changes the digest; the walk goes on
		}
		fmt.Fprintf(h, "%s:%d:%d:%v;", p, fi.Size(), fi.ModTime().UnixNano(), fi.IsDir())
		return nil
	})
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintf(h, "missing")
	}
	return hex.EncodeToString(h.Sum(nil))
}
