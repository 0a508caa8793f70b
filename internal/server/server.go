// Package server is the HTTP face of authz (`authz serve`): JSON decisions over HTTP, an OPA Data
// API compatible endpoint, plugin and facts inspection, health, readiness, Prometheus metrics
// and a decision log. docs/service.md is its user documentation.
//
// The package does not know where the facts come from: it reads them through FactsSource,
// which the live plugin host (internal/pluginhost) implements, and StaticFacts over a facts file.
// internal/service composes it with the host and the decision engine.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authz-dev/authz/internal/audit"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/tracing"
	"github.com/authz-dev/authz/internal/watch"
)

// Decider makes decisions; *decision.Engine is one.
type Decider interface {
	// Decide always returns a document; a non-nil error means the decision could not be
	// evaluated (coded.CodeOf gives its code) and the document denies.
	Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error)
	// Revision is the active policy's revision, "" while none is loaded.
	Revision() string
}

var _ Decider = (*decision.Engine)(nil)

// Options are the parts of a Server that are not configuration.
type Options struct {
	// Logger is the service log; a null logger when nil.
	Logger hclog.Logger
	// DecisionLog, when not nil, receives the decision log instead of Config.DecisionLog.Path
	// (tests use it; the server never closes it).
	DecisionLog io.Writer
	// Policy, when not nil, reports where the active policy came from (GET /v1/status and the
	// origin label of authz_policy_revision_info); the origin is "embedded" when nil.
	Policy PolicyStatus
	// Tracing, when its Provider is set, makes every decision a span (tracing.Decisions).
	Tracing tracing.Decisions
	// OPADecisionLog, when not nil, receives every decision for OPA's decision-log plugin,
	// masked like the local log; Policy serves as it when it is an OPADecisionLogger.
	OPADecisionLog OPADecisionLogger
}

// Server answers the HTTP API. Create it with New, serve it with Serve, and Close it
// when it is no longer served.
type Server struct {
	cfg     Config
	decider Decider
	facts   FactsSource
	log     hclog.Logger
	rec     *audit.Recorder // the decision log and OPA's (internal/audit)
	metrics *metrics
	handler http.Handler
	tls     *tls.Config
	access  *access
	admit   *admission
	policy  PolicyStatus
	// tracer opens decision spans; nil when tracing is off.
	tracer *tracing.DecisionTracer
	// watches are the open watches of POST /v1/authorize/watch; unwatch stops the change
	// listeners that feed them.
	watches *watch.Hub
	unwatch []func()
	parked  *parked // the watches' streams taken over from net/http (watchstream.go)
	// watchBudget shares the watches between callers (watchbudget.go).
	watchBudget *watchBudget
	// revokes records the watches' revokes off the streams' writers (revokelog.go).
	revokes *revokeLog
	// pipe is the one path of a decision (internal/pipeline, steps.go).
	pipe *pipeline.Pipeline
	// decisionNS is the observed time of a decision, a moving average (observeDecisionTime).
	decisionNS atomic.Int64
}

// New checks cfg (Validate), opens the decision log and loads the TLS certificate. It starts
// nothing: the facts source belongs to the caller, who closes it after Serve returns.
func New(cfg Config, d Decider, facts FactsSource, opts Options) (*Server, error) {
	if d == nil || facts == nil {
		return nil, errors.New("server: a decider and a facts source are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The watch settings are read from watches: alone from here on.
	deprecated := cfg.deprecatedWatchKeys()
	cfg.Watch = cfg.watches()
	cfg.Limits.MaxWatches, cfg.Limits.MaxWatchBytes, cfg.Limits.MaxWatchesPerCaller, cfg.Limits.MaxWatchBytesPerCaller = 0, 0, 0, 0
	s := &Server{cfg: cfg, decider: d, facts: facts, log: opts.Logger, policy: opts.Policy,
		tracer: opts.Tracing.Tracer()}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	for _, k := range deprecated {
		if k.set {
			s.log.Warn(fmt.Sprintf("%s is deprecated: write %s instead (the old key is read for one more release)", k.old, k.new),
				"key", k.old, "replacement", k.new)
		}
	}
	var err error
	if s.tls, err = tlsServerConfig(cfg); err != nil {
		return nil, err
	}
	if s.access, err = newAccess(cfg.Authentication); err != nil {
		return nil, err
	}
	opaLog := opts.OPADecisionLog
	if l, ok := opts.Policy.(OPADecisionLogger); ok && opaLog == nil {
		opaLog = l
	}
	var opa audit.OPALogger
	if opaLog != nil {
		opa = opaLog
	}
	if s.rec, err = audit.New(audit.Options{Writer: opts.DecisionLog, Path: cfg.DecisionLog.Path, Masks: cfg.DecisionLog.Mask,
		Required: cfg.DecisionLog.Required, OPA: opa, Logger: s.log,
		Unavailable: s.logUnavailable, // steps.go
	}); err != nil {
		return nil, err
	}
	s.admit = newAdmission(cfg.Limits, cfg.MaxBodyBytes)
	s.parked = newParked(s)
	s.watchBudget = newWatchBudget(cfg.Watch)
	s.revokes = newRevokeLog(s)
	s.pipe = s.newPipeline()
	s.watches = watch.New(redecider{s}, facts, watch.Options{RecheckInterval: cfg.Watch.RecheckInterval,
		MaxWatches: cfg.Watch.Max, MaxBytes: cfg.Watch.MaxBytes, Deadline: cfg.Limits.QueueWait,
		Logger: s.log.Named("watch")})
	// Every change a decision could read re-decides the watches it concerns.
	if f, ok := facts.(interface {
		OnFactsChange(func(pluginID string)) (cancel func())
	}); ok {
		s.unwatch = append(s.unwatch, f.OnFactsChange(s.watches.FactsChanged))
	}
	if p, ok := d.(interface {
		OnPolicyChange(func(revision string)) (cancel func())
	}); ok {
		s.unwatch = append(s.unwatch, p.OnPolicyChange(s.watches.PolicyChanged))
	}
	s.metrics = newMetrics(d, facts, s.policyOrigin)
	s.rec.CapLines(cfg.DecisionLog.MaxLineBytes, s.metrics.logCuts)
	s.metrics.reg.MustRegister(s.access.tokenMetrics()...)
	if c, ok := opts.Policy.(prometheus.Collector); ok {
		s.metrics.reg.MustRegister(c) // the policy source's own: authz_bundle_operations_total
	}
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "authz_watches_open",
		Help: "Watches open now (POST /v1/authorize/watch).",
	}, func() float64 { return float64(s.watches.Open()) }))
	s.handler = s.routes()
	return s, nil
}

// Close ends every open watch (a revoke with reason service_stopping), stops listening for
// changes and closes the decision log file the server opened. Call it after Serve returned.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	s.closeWatches(ctx)
	s.revokes.flush() // the revokes' lines are written before the log is closed
	return s.rec.Close()
}

// closeWatches revokes every open watch, stops the change listeners, and waits until ctx is
// done for the parked streams to have written their revoke.
func (s *Server) closeWatches(ctx context.Context) {
	for _, stop := range s.unwatch {
		stop()
	}
	s.watches.Close()
	s.parked.close(ctx)
}

// Reload reloads what can be reloaded while serving: it reopens the decision log file at its
// path (after a log rotation renamed it) and re-reads the bearer tokens file (so a token can be
// added or revoked). `authz serve` calls it on SIGHUP. A decision log that fails to reopen
// keeps the open file; a tokens file that fails to load revokes every token. Both are
// reported in the error.
func (s *Server) Reload() error {
	var errs []error
	if err := s.rec.Reopen(); err != nil {
		s.log.Error("reload: the decision log could not be reopened; still writing to the previous file", "error", err)
		errs = append(errs, err)
	} else if s.cfg.DecisionLog.Path != "" && s.cfg.DecisionLog.Path != "-" {
		s.log.Info("reload: decision log reopened", "path", s.cfg.DecisionLog.Path)
	}
	if err := s.access.reloadTokens(); err != nil {
		s.log.Error("reload: the tokens file was refused; every bearer token is revoked until it is fixed", "path", s.cfg.Authentication.TokensFile, "error", err)
		errs = append(errs, fmt.Errorf("authentication.tokensFile: %w", err))
	} else if s.cfg.Authentication.mode() == AuthToken {
		s.log.Info("reload: bearer tokens re-read", "path", s.cfg.Authentication.TokensFile)
	}
	// An open watch keeps the access it was opened with no longer than its token.
	s.revokeUnauthorizedWatches()
	return errors.Join(errs...)
}

// Serve answers on ln until ctx is done, then shuts down gracefully: it stops accepting, lets
// in-flight requests finish (up to ShutdownTimeout, after which they are cut off) and returns.
// It closes ln. It returns nil after a shutdown asked for by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	maxConns, err := connectionCap(s.cfg.Limits.MaxConnections, s.cfg.Limits.FDReserve)
	if err != nil {
		ln.Close()
		return err
	}
	if maxConns < s.cfg.Limits.MaxConnections {
		s.log.Warn("connection cap lowered to keep file descriptors for plugins (raise ulimit -n to allow more)",
			"max_connections", maxConns, "configured", s.cfg.Limits.MaxConnections, "fd_reserve", s.cfg.Limits.FDReserve)
	}
	// A parked watch keeps a descriptor beside the connections (watchstream.go).
	maxWatches, err := connectionCap(s.cfg.Watch.Max, s.cfg.Limits.FDReserve+maxConns)
	if err != nil {
		maxWatches = 0
	}
	if maxWatches < s.cfg.Watch.Max {
		s.log.Warn("watch cap lowered to keep file descriptors for connections and plugins (raise ulimit -n to allow more)",
			"max_watches", maxWatches, "configured", s.cfg.Watch.Max, "max_connections", maxConns, "fd_reserve", s.cfg.Limits.FDReserve)
	}
	s.watches.SetMaxWatches(maxWatches)
	limited := newConnLimit(ln, maxConns, s.log)
	ln = limited
	hs := &http.Server{
		ConnState:         limited.connState,
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.HTTP.ReadTimeout,
		WriteTimeout:      s.cfg.HTTP.WriteTimeout,
		IdleTimeout:       s.cfg.HTTP.IdleTimeout,
		MaxHeaderBytes:    s.cfg.HTTP.MaxHeaderBytes,
		// "OPTIONS *" goes to the route table too (404), not to net/http's own answer.
		DisableGeneralOptionsHandler: true,
		TLSConfig:                    s.tls,
		ErrorLog:                     s.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	scheme := "http"
	if s.tls != nil {
		scheme = "https"
	}
	s.log.Info("listening", "addr", listenerAddr(ln), "scheme", scheme, "authentication", s.cfg.Authentication.mode(),
		"revision", s.decider.Revision(), "max_connections", maxConns)
	s.access.warnCleartext(s.log, ln.Addr(), s.tls != nil)

	errc := make(chan error, 1)
	go func() {
		if s.tls != nil {
			errc <- hs.ServeTLS(ln, "", "")
		} else {
			errc <- hs.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", listenerAddr(ln), err)
	case <-ctx.Done():
	}
	// Open watches end first, each with a revoke that says the service stops: their streams
	// then finish like any other request.
	if n := s.watches.Open(); n > 0 {
		s.log.Info("shutting down: revoking open watches", "watches", n)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	s.closeWatches(sctx)
	s.log.Info("shutting down: finishing in-flight requests", "timeout", s.cfg.ShutdownTimeout)
	err = hs.Shutdown(sctx)
	if err != nil {
		s.log.Warn("in-flight requests did not finish in time; closing their connections", "error", err)
		_ = hs.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	s.log.Info("HTTP server stopped")
	return nil
}

// Listen opens a listener for "host:port" or "unix:///path". A stale unix socket (a socket
// file nobody answers on) is replaced; a live one or any other file is an error.
func Listen(addr string) (net.Listener, error) {
	network, address, err := parseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("addr: %w", err)
	}
	if network == "unix" {
		if fi, err := os.Lstat(address); err == nil {
			if fi.Mode()&os.ModeSocket == 0 {
				return nil, fmt.Errorf("addr: %s exists and is not a socket: remove it or choose another path", address)
			}
			if c, err := net.DialTimeout("unix", address, time.Second); err == nil {
				c.Close()
				return nil, fmt.Errorf("addr: %s: another process is serving on this socket", address)
			}
			if err := os.Remove(address); err != nil {
				return nil, fmt.Errorf("addr: remove stale socket %s: %w", address, err)
			}
		}
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

func listenerAddr(ln net.Listener) string {
	a := ln.Addr()
	if a.Network() == "unix" {
		return "unix://" + a.String()
	}
	return a.String()
}
