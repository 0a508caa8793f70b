package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/logtext"
)

// compileBundle compiles and checks a bundle into a policy under its manifest revision (a
// digest of its content when it has none).
func compileBundle(b *bundle.Bundle, origin string) (*GatePolicy, error) {
	mods := make(map[string]*ast.Module, len(b.Modules))
	for _, m := range b.Modules {
		mods[m.Path] = m.Parsed
	}
	return CompileGate(GateContent{Modules: mods, Data: b.Data, Revision: bundleRevision(b), Origin: origin})
}

// rawModules are the sources of a bundle's modules by path.
func rawModules(b *bundle.Bundle) map[string]string {
	out := make(map[string]string, len(b.Modules))
	for _, m := range b.Modules {
		out[m.Path] = string(m.Raw)
	}
	return out
}

// fileProvider is a bundle file or directory (Config.Bundle), read at start, on reload, and
// whenever it changes under Config.Watch. An opa section runs OPA's decision logs and status
// beside it.
type fileProvider struct {
	s  *Source
	wg sync.WaitGroup // the watch
}

func newFileProvider(s *Source) provider { return &fileProvider{s: s} }

func (p *fileProvider) start(ctx context.Context) error {
	// OPA's plugins start before the bundle is read, so that the bundle's policy is also the
	// one OPA's decision-log plugin masks and drops with.
	if err := p.s.startOPA(ctx, false); err != nil {
		return err
	}
	if err := p.s.loadFile(ctx); err != nil {
		p.s.stopOPA(context.WithoutCancel(ctx))
		return err
	}
	if p.s.cfg.Watch {
		p.wg.Go(func() { p.s.watch(context.WithoutCancel(ctx)) })
	}
	return nil
}

func (p *fileProvider) reload(ctx context.Context) error { return p.s.loadFile(ctx) }

func (*fileProvider) status(*Status) {}

func (p *fileProvider) close(ctx context.Context) {
	p.s.stopOPA(ctx)
	p.wg.Wait()
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
	fail := func(code coded.Code, err error) error {
		// The error quotes the bundle's entry names: it is shown and logged cleaned.
		e := &coded.Error{Code: code, Err: cleanedError{fmt.Errorf("%s: %w", path, err)}}
		st.Code, st.Message, st.Errors = string(code), e.Err.Error(), nil
		s.status.LastError = e.Error()
		if rev := s.eng.Revision(); rev != "" {
			s.log.Error("bundle refused; the active policy stays", "bundle", path, "active_revision", rev, "error", e.Error())
		}
		return e
	}
	b, err := readBundle(path, s.vc)
	if err != nil {
		return fail(coded.PolicyBundleLoad, err)
	}
	st.SetDownloadSuccess()
	st.Type = b.Type()
	var iat int64
	if s.vc != nil {
		// Signed bundles are ordered by their signature's issue time (order.go).
		if iat, err = signatureIAT(b.Signatures); err != nil {
			return fail(coded.PolicyBundleLoad, err)
		}
		if err := s.order.check(path, iat); err != nil {
			return fail(coded.PolicyBundleRollback, err)
		}
	}
	origin := OriginFile + ":" + path
	digest := contentDigest(origin, bundleRevision(b), rawModules(b), b.Data)
	if s.unchangedLocked(digest) {
		st.SetError(nil)
		s.status.LastError = ""
		return nil
	}
	p, err := compileBundle(b, origin)
	if err != nil {
		return fail(coded.PolicyBundleCheck, err)
	}
	if s.remote != nil {
		// OPA's decision-log plugin masks and drops with the policy of its plugin manager:
		// the bundle goes there too, or is refused (an unmasked log is not an option).
		if err := s.remote.install(ctx, path, b); err != nil {
			return fail(coded.PolicyBundleCheck, fmt.Errorf("install the bundle for OPA's decision log: %w", err))
		}
	}
	if err := s.activateGateLocked(ctx, p, digest); err != nil {
		return fail(coded.PolicyBundleCheck, err)
	}
	st.SetError(nil)
	st.SetActivateSuccess(p.Revision())
	_ = s.order.commit(map[string]int64{path: iat}) // a bundle file's order is kept in the process
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

// cleanedError is an error whose text is cleaned (logtext.Clean) and whose cause stays
// reachable with errors.Is and errors.As.
type cleanedError struct{ err error }

func (e cleanedError) Error() string { return logtext.Clean(e.err.Error()) }
func (e cleanedError) Unwrap() error { return e.err }
