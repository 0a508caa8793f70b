package pluginhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// supervise runs one plugin until ctx ends: start a worker, wait for it to exit, restart it
// after a back-off that doubles (capped at MaxBackoff) and goes back to MinBackoff once a
// worker stayed up for twice MaxBackoff. A plugin that fails to start keeps being retried and
// has status error meanwhile.
func (h *Host) supervise(ctx context.Context, m *managed) {
	defer h.wg.Done()
	backoff := newBackoff(h.cfg.MinBackoff, h.cfg.MaxBackoff)
	generation := m.lin.generation.Load() // an id's generations keep counting across reconfigurations
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			m.update(func(v *pluginView) { v.restarts++ })
		}
		w, stop, err := h.startWorker(ctx, m, generation+1)
		if err != nil {
			if ctx.Err() != nil {
				return // closing: not the plugin's fault
			}
			lastError := capText(err.Error(), h.cfg.Limits.MaxLastErrorBytes)
			code := startErrorCode(err)
			m.log.Error("plugin failed to start", "attempt", attempt+1, "retry_in", backoff.peek(), "code", string(code), "error", lastError)
			m.update(func(v *pluginView) {
				v.status = StatusError
				v.lastError, v.lastErrorCode = lastError, code
				v.worker = nil
			})
		} else {
			generation = w.generation
			m.lin.generation.Store(generation)
			h.forgetConfigChecks(m.cfg.ID, generation)
			m.log.Info("worker ready", "generation", w.generation, "pid", w.pid, "methods", w.methods)
			h.markReady(m)
			wctx, stopWatching := context.WithCancel(ctx)
			unresponsive := h.watch(wctx, w)
			var why string
			select {
			case <-ctx.Done():
				stopWatching()
				m.update(func(v *pluginView) { v.worker = nil })
				stop(stopGrace)
				return
			case <-w.done:
				// Out of the decisions already (the process is gone); the record follows below.
				h.changed.Notify(m.cfg.ID)
			case why = <-unresponsive:
				// Out of the facts at once: decisions deny with worker_not_running from here on,
				// without waiting for the kill.
				w.dropped.Store(true)
				m.update(func(v *pluginView) {
					if v.worker == w {
						v.worker = nil
					}
				})
				m.log.Error("worker does not answer; killing and restarting it", "generation", w.generation, "pid", w.pid, "reason", why)
			}
			stopWatching()
			upFor := time.Since(w.startedAt)
			grace := stopGrace
			if why != "" {
				grace = 0 // it answers nothing: asking it to exit would only delay the kill
			}
			exit := stop(grace)
			msg := fmt.Sprintf("worker generation %d (pid %d) exited after %s: %s", w.generation, w.pid, upFor.Round(time.Millisecond), exit)
			code := coded.WorkerExited
			if why != "" {
				msg = fmt.Sprintf("worker generation %d (pid %d) was killed after %s because %s: %s", w.generation, w.pid, upFor.Round(time.Millisecond), why, exit)
				code = coded.WorkerUnresponsive
			}
			if why := w.guard.why(); why != "" {
				msg, code = why+"; "+msg, coded.BrokerRefused
			}
			msg = capText(msg, h.cfg.Limits.MaxLastErrorBytes)
			if code != coded.WorkerUnresponsive {
				m.log.Error("worker exited; restarting", "generation", w.generation, "pid", w.pid, "exit", exit, "up_for", upFor)
			}
			if upFor >= 2*h.cfg.MaxBackoff {
				backoff.reset()
			}
			// The worker is already reported gone (its done channel is closed); record why.
			m.update(func(v *pluginView) {
				if v.worker == w {
					v.worker = nil
				}
				v.lastError, v.lastErrorCode = msg, code
			})
		}

		t := time.NewTimer(backoff.step())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// startErrorCode is the code of a failure to start a worker: the error's own, else
// coded.StartFailed.
func startErrorCode(err error) coded.Code {
	if code := coded.CodeOf(err); code != "" {
		return code
	}
	return coded.StartFailed
}

// watch checks the worker every Health.Interval until ctx ends or the worker exits, asking the
// worker itself rather than only its pid: go-plugin's gRPC health service over the worker's own
// connection, bounded by Health.Timeout, and the state of its main thread. The channel returned
// receives why the worker must be ended, once, when a check fails.
func (h *Host) watch(ctx context.Context, w *worker) <-chan string {
	unresponsive := make(chan string, 1)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.cfg.Health.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.done:
				return
			case <-t.C:
			}
			if why := h.checkWorker(ctx, w); why != "" {
				unresponsive <- why
				return
			}
		}
	}()
	return unresponsive
}

// checkWorker returns why the worker is no longer a worker, "" while it answers (or once it
// exited or ctx ended, which the supervisor sees by itself).
func (h *Host) checkWorker(ctx context.Context, w *worker) string {
	timeout := h.cfg.Health.Timeout
	if !w.proc.probe() {
		// A process that exited is reaped within moments; a thread-group leader that stays a
		// zombie while other threads run is never reported as exited (the probe, or the pidfd
		// of its main thread, took it out of the decisions already).
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-w.done:
			return ""
		case <-ctx.Done():
			return ""
		case <-t.C:
		}
		return "its main thread ended while other threads still run (such a process never exits by itself)"
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(w.conn).Check(cctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
	if ctx.Err() != nil || isClosed(w.done) {
		return ""
	}
	if err != nil {
		if status.Code(err) == codes.DeadlineExceeded {
			return fmt.Sprintf("it did not answer its health check within %s (health.timeout)", timeout)
		}
		return fmt.Sprintf("its health check failed: %v", err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Sprintf("its health check answered %s", st)
	}
	return ""
}

// backoff is a capped exponential back-off: min, 2·min, 4·min, … up to max.
type backoff struct {
	min, max, next time.Duration
}

func newBackoff(minWait, maxWait time.Duration) *backoff {
	return &backoff{min: minWait, max: maxWait, next: minWait}
}

// peek returns the next wait without taking it.
func (b *backoff) peek() time.Duration { return b.next }

// step returns the next wait and doubles the one after it, up to max.
func (b *backoff) step() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

// reset starts again from min.
func (b *backoff) reset() { b.next = b.min }

// startWorker starts one worker process and, once it is fully set up (handshake, Describe,
// SupportedMethods, valid manifest, still the pinned executable), publishes it as the plugin's
// ready worker with the given generation. stop ends it and every descendant (gracefully first)
// and returns how the process ended.
//
// What runs is a sealed in-memory copy of the bytes whose digest was checked (openPinned); the
// host talks to it only over the unix socket it announced, only when the peer of that socket is
// the worker's own pid, and publishes it only while /proc/PID/exe is still that copy.
func (h *Host) startWorker(ctx context.Context, m *managed, generation uint64) (_ *worker, stop func(grace time.Duration) string, err error) {
	deadline := time.Now().Add(h.cfg.StartTimeout)
	exe, err := h.openPinnedBinary(m)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = exe.Close() }()

	l := h.newLaunch(ctx, m, exe)
	// go-plugin's Start cannot be interrupted: the host closing kills the process at once.
	abortStart := context.AfterFunc(ctx, l.killProcess)
	setUp := false
	defer func() {
		abortStart()
		if !setUp {
			err = l.abandon(err)
		}
	}()

	drv, err := l.handshake(h.cfg.StartTimeout)
	if err != nil {
		return nil, nil, err
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	desc, methods, err := h.describe(rctx, m, l, drv)
	if err != nil {
		return nil, nil, err
	}
	w, err := h.publishWorker(m, l, drv, desc, methods, generation)
	if err != nil {
		return nil, nil, err
	}
	setUp = true
	return w, l.kill, nil
}

// openPinnedBinary opens the sealed copy of the plugin's binary whose SHA-256 is its pin (or,
// with InsecureSkipPinCheck, whatever is at the path, with a warning).
func (h *Host) openPinnedBinary(m *managed) (*pinnedExecutable, error) {
	p := m.cfg
	var want []byte
	if h.cfg.InsecureSkipPinCheck {
		m.log.Warn("INSECURE: starting a plugin binary WITHOUT checking its SHA-256 pin (InsecureSkipPinCheck); "+
			"whatever binary is at this path runs with the host's trust. Never use this in production.", "path", p.Path)
	} else {
		want, _ = hex.DecodeString(p.SHA256) // Validate checked the format
	}
	exe, warnings, err := openPinned(p.Path, want, p.AllowWritableBinary)
	for _, w := range warnings {
		m.log.Warn("INSECURE: "+w+"; anyone who can write there can replace the driver (allowWritableBinary is set)", "path", p.Path)
	}
	return exe, err
}

// launch is one start of a worker: the go-plugin client and the process it runs.
type launch struct {
	m         *managed
	client    *plugin.Client
	pr        atomic.Pointer[proc] // set once go-plugin has started the process
	socketDir string
	guard     *guard           // ends the process when the driver abuses the host (see refuseBroker)
	conn      *grpc.ClientConn // the connection to the driver, once the handshake is done
}

// newLaunch configures the go-plugin client that runs exe (gRPC only, AutoMTLS, no inherited
// environment, the driver's output relayed within Limits). It starts nothing; a process it
// starts after ctx has ended is killed at once.
func (h *Host) newLaunch(ctx context.Context, m *managed, exe *pinnedExecutable) *launch {
	lim := h.cfg.Limits
	l := &launch{m: m, guard: &guard{}}
	l.guard.setKill(l.killProcess)
	l.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  driverplugin.Handshake,
		VersionedPlugins: driverplugin.PluginSets,
		RunnerFunc: func(_ hclog.Logger, spec *exec.Cmd, dir string) (runner.Runner, error) {
			l.socketDir = dir
			pp, err := newProc(m.log, spec, exe, m.cfg, dir, h.reaper)
			if err != nil {
				return nil, err
			}
			l.pr.Store(pp)
			if ctx.Err() != nil { // ended before abortStart could see the process: abort here
				_ = pp.Kill(context.Background())
			}
			return pp, nil
		},
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: h.cfg.SocketDir},
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				pp := l.pr.Load()
				if pp == nil {
					return nil, errors.New("no driver process")
				}
				return pp.dial(ctx, addr)
			}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(lim.MaxMessageBytes)),
			grpc.WithMaxHeaderListSize(uint32(lim.MaxCheckAnswerBytes)), // an error's text travels in headers
			grpc.WithStreamInterceptor(refuseBroker(m.log, l.guard, lim.MaxBrokerMessages)),
		},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		SkipHostEnv:      true,
		StartTimeout:     h.cfg.StartTimeout,
		// go-plugin's own messages; the driver's output is relayed by m.dlog, within Limits.
		Logger:     stopLogger{pluginLogger{m.log}},
		Stderr:     m.dlog.writer("stderr"),
		SyncStdout: m.dlog.writer("stdout"), // what the driver prints after the handshake
		SyncStderr: m.dlog.writer("stderr"),
	})
	return l
}

// killProcess kills the driver process, if it was started, without waiting.
func (l *launch) killProcess() {
	if pp := l.pr.Load(); pp != nil {
		_ = pp.Kill(context.Background())
	}
}

// stopGrace is how long stopping a worker waits for it to exit once asked to (go-plugin's
// graceful shutdown) before the host kills it.
const stopGrace = 2 * time.Second

// killWait bounds, after the SIGKILL, the wait for go-plugin to let go of a process the kernel
// could not reap (a process in uninterruptible sleep).
const killWait = 5 * time.Second

// kill ends the driver and every descendant and returns how the process ended. It never waits on
// the driver's cooperation: it asks for a graceful exit, waits grace at most, then SIGKILLs the
// process, its group and its descendants.
func (l *launch) kill(grace time.Duration) string {
	defer l.m.dlog.flush()
	pp := l.pr.Load()
	if pp == nil {
		l.client.Kill() // no process: nothing to ask or to wait for
		return "killed"
	}
	pp.endDescendants() // while the driver lives, its tree is intact
	// go-plugin's Kill asks the driver to shut down and waits for that call without a bound: a
	// stopped driver never answers. It ends once the process is gone.
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		l.client.Kill()
	}()
	if grace > 0 {
		t := time.NewTimer(grace)
		select {
		case <-pp.exited:
		case <-t.C:
			l.m.log.Warn("driver did not exit within the stop grace period; killing it", "pid", pp.started(), "grace", grace)
		}
		t.Stop()
	}
	_ = pp.Kill(context.Background())
	lost := time.NewTimer(killWait)
	select {
	case <-asked:
	case <-lost.C:
		l.m.log.Error("driver process not reaped after SIGKILL; leaving it", "pid", pp.started())
	}
	lost.Stop()
	pp.release()
	select {
	case <-pp.exited:
		if t := pp.exitText(); t != "" {
			return t
		}
	default:
	}
	return "killed"
}

// stopLogger drops go-plugin's "plugin failed to exit gracefully" warning: the host stops a
// worker itself (launch.kill) and says so when a driver did not exit in time; go-plugin also
// prints it for a process that never completed its start, which was never asked to exit.
type stopLogger struct{ hclog.Logger }

func (l stopLogger) Warn(msg string, args ...any) {
	if msg == "plugin failed to exit gracefully" {
		return
	}
	l.Logger.Warn(msg, args...)
}

// abandon cleans up a start that failed with err and returns the error to report.
func (l *launch) abandon(err error) error {
	l.kill(stopGrace)
	if l.socketDir != "" {
		_ = os.RemoveAll(l.socketDir) // go-plugin leaves it when the process never started
	}
	if why := l.guard.why(); why != "" {
		err = coded.Errorf(coded.BrokerRefused, "%s (%w)", why, err)
	}
	return err
}

// refused returns why the process refused the host's checks (its socket peer, its
// executable), when it did; err otherwise.
func (l *launch) refused(err error) error {
	if pp := l.pr.Load(); pp != nil {
		if why := pp.refused(); why != nil {
			return why
		}
	}
	return err
}

// handshake starts the process, completes the go-plugin handshake and dispenses the driver.
func (l *launch) handshake(startTimeout time.Duration) (*driverplugin.GRPCClient, error) {
	rpcClient, err := l.client.Client()
	if err != nil {
		return nil, l.refused(l.explainStartError(err, startTimeout))
	}
	gc, ok := rpcClient.(*plugin.GRPCClient)
	if !ok {
		return nil, fmt.Errorf("go-plugin client: got %T, want *plugin.GRPCClient", rpcClient)
	}
	l.conn = gc.Conn
	raw, err := rpcClient.Dispense(driverplugin.PluginName)
	if err != nil {
		return nil, l.refused(fmt.Errorf("dispense %q: %w", driverplugin.PluginName, err))
	}
	drv, ok := raw.(*driverplugin.GRPCClient)
	if !ok {
		return nil, fmt.Errorf("dispense %q: got %T, want *driverplugin.GRPCClient", driverplugin.PluginName, raw)
	}
	return drv, nil
}

// describe asks the driver for its manifest and methods and checks them against Limits and the
// manifest rules.
func (h *Host) describe(ctx context.Context, m *managed, l *launch, drv *driverplugin.GRPCClient) (driverplugin.Description, []string, error) {
	lim := h.cfg.Limits
	desc, err := drv.Describe(ctx)
	if err != nil {
		return desc, nil, l.refused(explainRPCError(lim, err))
	}
	methods, err := drv.SupportedMethods(ctx)
	if err != nil {
		return desc, nil, l.refused(explainRPCError(lim, err))
	}
	methods = dedupeMethods(methods)
	if err := checkBounds(lim, desc, methods); err != nil {
		return desc, nil, err
	}
	if err := validateManifest(desc); err != nil {
		return desc, nil, coded.Errorf(coded.InvalidManifest, "invalid manifest from plugin %q: %w", desc.Key, err)
	}
	if n, examples := unknownCapabilities(desc); n > 0 {
		m.log.Warn("manifest declares capabilities the host does not know; they have no effect",
			"count", n, "examples", examples)
	}
	return desc, methods, nil
}

// publishWorker checks, right before it is published, that the worker still runs the pinned
// bytes, and publishes it as the plugin's ready worker of this generation.
func (h *Host) publishWorker(m *managed, l *launch, drv *driverplugin.GRPCClient, desc driverplugin.Description, methods []string, generation uint64) (*worker, error) {
	pp := l.pr.Load()
	if err := pp.checkExecutable(); err != nil {
		return nil, err
	}
	w := &worker{
		pid:        pp.started(),
		generation: generation,
		startedAt:  time.Now(),
		methods:    methods,
		driver:     drv,
		conn:       l.conn,
		proc:       pp,
		done:       pp.exited,
		guard:      l.guard,
	}
	// A decision's last look (snapshot.Worker.Alive): a stopped or dead worker grants nothing.
	w.facts = snapshot.NewWorker(generation, w.methods, pp.running)
	if err := h.publishReady(m, desc, w); err != nil {
		return nil, err
	}
	return w, nil
}

// explainStartError adds what to do next to go-plugin's start errors, and says what happened
// to the process: its exit status when it exited before the handshake, the configured path
// rather than that of the in-memory copy it runs from.
func (l *launch) explainStartError(err error, timeout time.Duration) error {
	msg := err.Error()
	const unrecognized = "Unrecognized remote plugin message: "
	switch {
	case strings.HasPrefix(msg, unrecognized):
		// go-plugin appends guesses about the architecture; the first line is what matters.
		line, _, _ := strings.Cut(strings.TrimPrefix(msg, unrecognized), "\n")
		if line == "" {
			if exit := l.exitBeforeHandshake(); exit != "" {
				return coded.Errorf(coded.HandshakeFailed, "plugin exited before the go-plugin handshake with %s%s (see the plugin's log lines)", exit, notADriver(exit))
			}
			return coded.Errorf(coded.HandshakeFailed, "plugin ended its stdout before the go-plugin handshake: is it a driver that calls driverplugin.Serve? (see the plugin's log lines)")
		}
		return coded.Errorf(coded.HandshakeFailed, "plugin wrote to stdout before the go-plugin handshake (stdout is reserved for the handshake; a driver must log to stderr): got %q", line)
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return coded.Errorf(coded.StartTimeout, "plugin did not complete the go-plugin handshake within the start timeout (%s)", timeout)
	case strings.Contains(msg, "plugin exited before we could connect"):
		exit := l.exitBeforeHandshake()
		if exit == "" {
			exit = "an unknown status"
		}
		return coded.Errorf(coded.HandshakeFailed, "plugin exited before the go-plugin handshake with %s%s (see the plugin's log lines)", exit, notADriver(exit))
	}
	if pe, ok := errors.AsType[*fs.PathError](err); ok && pe.Op == "fork/exec" {
		return coded.Errorf(coded.StartFailed, "cannot execute the plugin binary %s: %v (is it an executable for this system?)", l.m.cfg.Path, pe.Err)
	}
	if strings.HasPrefix(msg, "start plugin: ") {
		return err
	}
	return fmt.Errorf("start plugin: %w", err)
}

// exitWait is how long a failed start waits for the process to be reaped, to report its exit
// status.
const exitWait = 250 * time.Millisecond

// exitBeforeHandshake waits briefly for the process that ended its stdout to be reaped and
// returns how it ended ("exit status 3", "signal: killed"); "" when it has not exited.
func (l *launch) exitBeforeHandshake() string {
	pp := l.pr.Load()
	if pp == nil {
		return ""
	}
	t := time.NewTimer(exitWait)
	defer t.Stop()
	select {
	case <-pp.exited:
	case <-t.C:
		return ""
	}
	return pp.exitText()
}

// notADriver adds a hint when a process exited successfully before the handshake: it is most
// likely not a driver.
func notADriver(exit string) string {
	if exit == "exit status 0" {
		return ": is it a driver whose main calls driverplugin.Serve?"
	}
	return ""
}

// knownCapabilities are the capability keys of this release: api.CapabilityKeys, the one Go
// list of docs/contract.md, "The nine capabilities".
var knownCapabilities = func() map[string]bool {
	m := make(map[string]bool, len(api.CapabilityKeys))
	for _, k := range api.CapabilityKeys {
		m[k] = true
	}
	return m
}()

// checkPluginKey refuses a plugin key that is empty or holds anything but printable ASCII
// without spaces: a key is shown to people (/v1/plugins, the facts, the metrics), and two keys
// that differ only by an invisible character or a lookalike letter ("example.sandbox\u200b",
// a Cyrillic "е") would read as one.
func checkPluginKey(key string) error {
	if key == "" {
		return errors.New("must not be empty")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			q := key
			if len(q) > 64 {
				q = q[:64]
			}
			// %+q: the key in ASCII, so the lookalike shows (\u0435, \u200b).
			return fmt.Errorf("%+q holds byte 0x%02x at offset %d: a plugin key must be printable ASCII without spaces (0x21-0x7e)", q, c, i)
		}
	}
	return nil
}

// validateManifest refuses a manifest the host will not publish: a plugin key that is empty or
// not printable ASCII without spaces (checkPluginKey), an entry
// with an empty or repeated driver key, a kind other than sandbox_provider/environment_driver,
// or a sandboxCapabilities value that is not a boolean (null included).
func validateManifest(d driverplugin.Description) error {
	var errs []error
	if err := checkPluginKey(d.Key); err != nil {
		errs = append(errs, fmt.Errorf("key: %w", err))
	}
	seen := map[string]int{}
	for i, e := range d.EnvironmentDrivers {
		field := fmt.Sprintf("environmentDrivers[%d]", i)
		if e.DriverKey == "" {
			errs = append(errs, fmt.Errorf("%s.driverKey: must not be empty", field))
		} else if prev, dup := seen[e.DriverKey]; dup {
			errs = append(errs, fmt.Errorf("%s.driverKey: %q is also the driver key of environmentDrivers[%d]", field, e.DriverKey, prev))
		} else {
			seen[e.DriverKey] = i
		}
		if e.Kind != driverplugin.KindSandboxProvider && e.Kind != driverplugin.KindEnvironmentDriver {
			errs = append(errs, fmt.Errorf("%s.kind: %q is neither %q nor %q", field, e.Kind, driverplugin.KindSandboxProvider, driverplugin.KindEnvironmentDriver))
		}
		for _, k := range slices.Sorted(maps.Keys(e.SandboxCapabilities)) {
			v := e.SandboxCapabilities[k]
			if _, ok := v.(bool); !ok {
				js, _ := json.Marshal(v)
				if len(js) > 64 { // the value may be as large as the driver's message
					js = append(js[:64:64], "…"...)
				}
				errs = append(errs, fmt.Errorf("%s.sandboxCapabilities.%s: must be a boolean, got %s", field, k, js))
			}
		}
	}
	const maxProblems = 10
	if len(errs) > maxProblems {
		errs = append(errs[:maxProblems], fmt.Errorf("and %d more problems", len(errs)-maxProblems))
	}
	return errors.Join(errs...)
}

// FileSHA256 returns the lower-case hex SHA-256 of the file at path: the pin a PluginConfig
// needs for that binary (what `sha256sum` prints).
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
