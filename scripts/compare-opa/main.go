// Command compare-opa measures `authz serve` side by side with a stock `opa run --server` that
// serves the same policies/, on loopback, in one run.
//
// It builds authz and the pinned OPA, starts them on free loopback ports (authz with a static
// facts file it writes, once with the decision cache and once without), and sends them the same
// decisions: authz gets the request (POST /v1/authorize) and assembles the input itself; OPA gets
// the input authz assembles (POST /v1/data/authz/decision), the document `authz decide
// --print-input` prints, checked on a sample. Every answer is checked against the independent
// oracle (allow and code). Three streams: "distinct" (no two requests share what the policy
// reads), "replay" (a few hundred leases asked again and again) and "grant" (one grant of the
// replay stream, repeated); and the floor, GET /health on each server. Each cell runs --rounds
// times, alternating the servers, at each concurrency.
//
// --servers floor adds the HTTP floor: a tiny net/http server in a process of its own (this
// program, started again) that reads and JSON-decodes the body and answers a canned decision (the
// grant's allow and code); it gets the grant stream and GET /health only, and each grant row
// says its rate as a fraction of the floor's. --base-authz adds an authz binary built elsewhere
// (an older commit, say) as one more server, measured side by side in the same run:
//
//	git worktree add /tmp/base <commit> && (cd /tmp/base && go build -o /tmp/base-authz ./cmd/authz)
//	go run ./scripts/compare-opa --servers authz,opa,floor --base-authz /tmp/base-authz --streams grant \
//	    --duration 3s --rounds 2 --paced=false --restart=false
//
// Then (--paced) each server gets distinct requests at fractions of its peak rate of the
// closed-loop table (--paced-at, default one half), open loop: requests leave on a fixed
// schedule whatever the answers do, and a latency is counted from the time the request was due
// until its answer was read, so a stall is not hidden by the sender waiting for it. Right after,
// the same server's floor (GET /health) is sent at the same rate the same way, so that each row
// of a server has beside it the tail the machine, the sender and the HTTP stack give at that
// rate without any decision. Each row also says how late the sender itself started requests
// (its goroutines or its CPU were busy), how many connections it dialled during the run (none
// with --prewarm), and, from /proc and the server's /metrics, the CPU, scheduling latency and
// garbage collections of the server and of the sender, which is what makes a tail on a machine
// with few cores. --sender-cpus and --server-cpus pin the sender and the servers to separate
// CPUs (taskset); --peak skips the closed-loop table; --variant adds an authz server with other
// runtime settings (GOGC=200, GOMAXPROCS=1, ...) measured side by side.
//
// And (--restart) a separate `authz serve` with the built-in example driver is sent the
// example grant on a fixed schedule while its driver's worker is killed (SIGKILL) and the host
// restarts it: the latency and answers before the kill, from the kill until the first grant
// again, and after.
//
//	go run ./scripts/compare-opa --duration 3s --concurrency 1,8,32
//	go run ./scripts/compare-opa --peak 4000 --paced-at 0.1,0.25,0.5 --restart=false   # open loop only
//	go run ./scripts/compare-opa --concurrency 8 --sender-cpus 0 --server-cpus 1 --servers authz --variant GOGC=100
//
// Everything it starts is stopped when it returns, and the whole run is bounded by --timeout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specoracle"
)

type options struct {
	duration    time.Duration
	concurrency []int
	rounds      int
	leases      int
	perCell     int
	timeout     time.Duration
	paced       bool
	restart     bool
	pacedAt     []float64
	peak        float64
	senders     int
	client      string
	prewarm     bool
	senderProcs int
	senderCPUs  []int
	serverCPUs  string
	servers     []string
	variants    []string
	streams     []string
	baseAuthz   string
}

// floorMarker, as this program's first argument, makes it the HTTP floor server (serveFloor).
const floorMarker = "-compare-opa-floor-server"

// floorName is the HTTP floor's name in the tables.
const floorName = "floor (net/http)"

func main() {
	if len(os.Args) > 1 && os.Args[1] == floorMarker {
		os.Exit(serveFloor(os.Args[2:]))
	}
	var o options
	var conc, streams string
	flag.StringVar(&streams, "streams", "distinct,replay,grant,floor", "comma-separated streams of the closed-loop table: distinct, replay, grant (one grant repeated), floor (GET /health)")
	flag.StringVar(&o.baseAuthz, "base-authz", "", "also measure this authz binary (decision cache on), named \"authz base\": an older build side by side in the same run")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "time of one cell (one server, one stream, one concurrency, one round)")
	flag.StringVar(&conc, "concurrency", "1,8,32", "comma-separated connection counts")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds per cell, alternating the servers")
	flag.IntVar(&o.leases, "leases", 300, "leases of the replay stream")
	flag.IntVar(&o.perCell, "distinct", 12000, "distinct requests prepared per cell of the distinct stream (a cell ends early when they run out)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole run")
	flag.BoolVar(&o.paced, "paced", true, "also send the distinct stream at fractions of each server's peak rate (--paced-at), open loop, each followed by the server's floor (GET /health) at the same rate, and report their latency from the due time")
	flag.BoolVar(&o.restart, "restart", true, "also measure decision latency while the example driver's worker is killed and restarted under load")
	var pacedAt, senderCPUs, servers string
	flag.StringVar(&pacedAt, "paced-at", "0.5", "comma-separated fractions of each server's peak rate for the open-loop run (--paced); 0.1,0.25,0.5 shows how the tail grows with load")
	flag.Float64Var(&o.peak, "peak", 0, "take this req/s as every server's peak and skip the closed-loop table (0: measure it)")
	flag.IntVar(&o.senders, "senders", 64, "sender goroutines and keep-alive connections of the open-loop run; a request is sent at its due time or as soon as one is free, the wait counted in its latency")
	flag.StringVar(&o.client, "sender-client", "raw", "HTTP client of the open-loop senders: raw (each sender writes its requests on a keep-alive connection of its own and reads the answers with http.ReadResponse: no shared pool, no dial while a run lasts) or transport (one net/http Transport shared by the senders)")
	flag.BoolVar(&o.prewarm, "prewarm", true, "open every sender's connection before the open-loop schedule starts, so that no request waits for a dial")
	flag.IntVar(&o.senderProcs, "sender-procs", 0, "GOMAXPROCS of this program (the sender) once it has built the servers (0: the Go default)")
	flag.StringVar(&senderCPUs, "sender-cpus", "", "pin this program (the sender) to these CPUs, e.g. 0 (comma-separated; empty: not pinned)")
	flag.StringVar(&o.serverCPUs, "server-cpus", "", "pin every server to these CPUs with taskset -c, e.g. 1 (empty: not pinned)")
	flag.StringVar(&servers, "servers", "authz,nocache,opa", "comma-separated servers to measure: authz, nocache (authz with the decision cache off), opa, floor (the HTTP floor: net/http reading and JSON-decoding the body, answering a canned decision; grant stream and GET /health only)")
	flag.Func("variant", "an extra authz server (decision cache on) with this environment, e.g. GOGC=100 or GOGC=off,GOMEMLIMIT=48MiB (comma-separated KEY=VALUE; repeatable)", func(v string) error {
		for _, kv := range strings.Split(v, ",") {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return fmt.Errorf("want KEY=VALUE[,KEY=VALUE], got %q", v)
			}
		}
		o.variants = append(o.variants, v)
		return nil
	})
	flag.Parse()
	for _, s := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "compare-opa: bad --concurrency %q\n", conc)
			os.Exit(2)
		}
		o.concurrency = append(o.concurrency, n)
	}
	for _, s := range strings.Split(pacedAt, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || f <= 0 || f > 1 {
			fmt.Fprintf(os.Stderr, "compare-opa: bad --paced-at %q: want fractions in (0, 1]\n", pacedAt)
			os.Exit(2)
		}
		o.pacedAt = append(o.pacedAt, f)
	}
	if senderCPUs != "" {
		for _, s := range strings.Split(senderCPUs, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 0 {
				fmt.Fprintf(os.Stderr, "compare-opa: bad --sender-cpus %q\n", senderCPUs)
				os.Exit(2)
			}
			o.senderCPUs = append(o.senderCPUs, n)
		}
	}
	for _, s := range strings.Split(servers, ",") {
		switch s = strings.TrimSpace(s); s {
		case "authz", "nocache", "opa", "floor":
			o.servers = append(o.servers, s)
		default:
			fmt.Fprintf(os.Stderr, "compare-opa: bad --servers %q: want authz, nocache, opa, floor\n", servers)
			os.Exit(2)
		}
	}
	for _, s := range strings.Split(streams, ",") {
		switch s = strings.TrimSpace(s); s {
		case "distinct", "replay", "grant", "floor":
			o.streams = append(o.streams, s)
		default:
			fmt.Fprintf(os.Stderr, "compare-opa: bad --streams %q: want distinct, replay, grant, floor\n", streams)
			os.Exit(2)
		}
	}
	if o.client != "raw" && o.client != "transport" {
		fmt.Fprintf(os.Stderr, "compare-opa: bad --sender-client %q: want raw or transport\n", o.client)
		os.Exit(2)
	}
	if o.senders < 1 {
		fmt.Fprintln(os.Stderr, "compare-opa: --senders must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	err := run(ctx, o, os.Stdout)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare-opa:", err)
		os.Exit(1)
	}
}

// call is one prepared decision: the bodies for each server and the oracle's answer.
type call struct {
	authzBody, opaBody []byte
	allow              bool
	code               string
}

type server struct {
	name  string
	url   string
	cmd   *exec.Cmd
	opa   bool
	floor bool // the HTTP floor: the grant stream and GET /health only
}

func run(ctx context.Context, o options, out io.Writer) error {
	dir, err := os.MkdirTemp("", "compare-opa-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	authzBin := filepath.Join(dir, "authz")
	if err := command(ctx, root, "go", "build", "-o", authzBin, "./cmd/authz").Run(); err != nil {
		return fmt.Errorf("build authz: %w", err)
	}
	opaPath, err := command(ctx, root, "go", "tool", "-n", "opa").Output()
	if err != nil {
		return fmt.Errorf("build the pinned opa (go tool -n opa): %w", err)
	}
	opaBin := strings.TrimSpace(string(opaPath))

	factsVal := makeFacts(o.leases)
	factsJSON, _ := json.Marshal(factsVal)
	factsFile := filepath.Join(dir, "facts.json")
	if err := os.WriteFile(factsFile, factsJSON, 0o600); err != nil {
		return err
	}
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	if err != nil {
		return err
	}
	streams := map[string][]call{}
	replay, err := prepare(ctx, facts, factsVal, o.leases, func(i int) map[string]any { return replayRequest(i, o.leases) })
	if err != nil {
		return err
	}
	streams["replay"] = replay
	for _, c := range replay {
		if c.allow {
			streams["grant"] = []call{c}
			break
		}
	}
	if streams["grant"] == nil {
		return errors.New("no grant in the replay stream")
	}
	cells := len(o.concurrency) * o.rounds
	if o.peak > 0 {
		cells = 0 // no closed-loop table
	}
	distinct, err := prepare(ctx, facts, factsVal, o.perCell*cells, distinctRequest)
	if err != nil {
		return err
	}
	streams["distinct"] = distinct
	if err := checkPrintInput(ctx, authzBin, factsFile, replay[0], replayRequest(0, o.leases), facts); err != nil {
		return err
	}

	authzArgs := []string{"serve", "--facts", factsFile, "--log-level", "error"}
	var servers []*server
	for _, k := range o.servers {
		switch k {
		case "authz":
			servers = append(servers, &server{name: "authz", cmd: o.serverCmd(authzBin, authzArgs...)})
		case "nocache":
			servers = append(servers, &server{name: "authz (cache off)", cmd: o.serverCmd(authzBin, append(slices.Clone(authzArgs), "--decision-cache", "off")...)})
		case "opa":
			servers = append(servers, &server{name: "opa", opa: true, cmd: o.serverCmd(opaBin, "run", "--server", "--log-level", "error", "--skip-version-check", filepath.Join(root, "policies"))})
		case "floor":
			self, err := os.Executable()
			if err != nil {
				return err
			}
			g := streams["grant"][0]
			answer, _ := json.Marshal(map[string]any{"allow": g.allow, "code": g.code})
			servers = append(servers, &server{name: floorName, floor: true, cmd: o.serverCmd(self, floorMarker, "--answer", string(answer))})
		}
	}
	if o.baseAuthz != "" {
		servers = append(servers, &server{name: "authz base", cmd: o.serverCmd(o.baseAuthz, authzArgs...)})
	}
	for _, v := range o.variants {
		cmd := o.serverCmd(authzBin, authzArgs...)
		cmd.Env = append(os.Environ(), strings.Split(v, ",")...)
		servers = append(servers, &server{name: "authz " + v, cmd: cmd})
	}
	for _, s := range servers {
		if err := s.start(ctx); err != nil {
			stopAll(servers)
			return err
		}
	}
	defer stopAll(servers)
	if err := o.pinSender(); err != nil {
		return err
	}

	fmt.Fprintf(out, "# authz vs stock OPA, %s per cell, %d rounds alternating, %s\n\n", o.duration, o.rounds, time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "Sender: GOMAXPROCS %d, CPUs %s; servers' CPUs %s; %d CPUs online.\n\n", runtime.GOMAXPROCS(0),
		orAll(strings.Trim(fmt.Sprint(o.senderCPUs), "[]")), orAll(o.serverCPUs), runtime.NumCPU())
	peaks := map[string]float64{} // each server's best closed-loop rate on the distinct stream
	if o.peak > 0 {
		for _, s := range servers {
			peaks[s.name] = o.peak
		}
		fmt.Fprintf(out, "Closed-loop table skipped (--peak): every server's peak taken as %.0f req/s.\n", o.peak)
	} else if err := closedLoop(ctx, o, servers, streams, peaks, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n| server | RSS now MiB | peak RSS MiB |\n|---|---|---|\n")
	for _, s := range servers {
		now, peak := rss(s.cmd.Process.Pid)
		fmt.Fprintf(out, "| %s | %.1f | %.1f |\n", s.name, now, peak)
	}
	if o.paced {
		if err := pacedTable(ctx, o, servers, peaks, facts, factsVal, out); err != nil {
			return err
		}
	}
	if o.restart {
		stopAll(servers) // the restart run has the machine to itself
		if err := restartRun(ctx, authzBin, root, out); err != nil {
			return fmt.Errorf("restart run: %w", err)
		}
	}
	return nil
}

// closedLoop runs the closed-loop table: each stream at each concurrency, --rounds times
// alternating the servers, and records each server's best rate on the distinct stream in peaks.
func closedLoop(ctx context.Context, o options, servers []*server, streams map[string][]call, peaks map[string]float64, out io.Writer) error {
	fmt.Fprintf(out, "| stream | conns | server | req/s | p50 ms | p90 ms | p99 ms | errors | vs opa | vs floor | srv CPU ms/req | snd CPU ms/req |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, stream := range o.streams {
		servers := slices.DeleteFunc(slices.Clone(servers), func(s *server) bool { return s.floor && stream != "grant" && stream != "floor" })
		for ci, c := range o.concurrency {
			results := map[string]*result{}
			for round := range o.rounds {
				order := slices.Clone(servers)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, s := range order {
					calls := streams[stream]
					if stream == "distinct" {
						cell := ci*o.rounds + round
						calls = calls[cell*o.perCell : (cell+1)*o.perCell]
					}
					cpu0, snd0 := cpuSeconds(s.cmd.Process.Pid), readSenderStats()
					r := load(ctx, s, stream, calls, c, o.duration, stream == "distinct")
					r.srvCPU, r.sndCPU = cpuSeconds(s.cmd.Process.Pid)-cpu0, readSenderStats().since(snd0).cpu
					if results[s.name] == nil {
						results[s.name] = &result{}
					}
					results[s.name].merge(r)
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
			if stream == "distinct" {
				for _, s := range servers {
					peaks[s.name] = max(peaks[s.name], results[s.name].rate())
				}
			}
			for _, s := range servers {
				r := results[s.name]
				vs, vsFloor := "—", "—"
				if opa := results["opa"]; opa != nil && opa.rate() > 0 {
					vs = fmt.Sprintf("%.2fx", r.rate()/opa.rate())
				}
				if fl := results[floorName]; fl != nil && fl.rate() > 0 {
					vsFloor = fmt.Sprintf("%.2f", r.rate()/fl.rate())
				}
				fmt.Fprintf(out, "| %s | %d | %s | %.0f | %.2f | %.2f | %.2f | %d | %s | %s | %.3f | %.3f |\n", stream, c, s.name, r.rate(),
					r.pct(50), r.pct(90), r.pct(99), r.errors, vs, vsFloor, 1000*r.srvCPU/float64(max(1, r.n)), 1000*r.sndCPU/float64(max(1, r.n)))
			}
		}
	}
	return nil
}

// pacedTable sends each server distinct requests at each --paced-at fraction of its peak, open
// loop, and then its floor (GET /health) at the same rate, --rounds times alternating the
// servers, and prints one row for each: the latency from the due time, how late the sender
// itself was, the connections it had to dial during the run, and the garbage collections of the
// server and of the sender.
func pacedTable(ctx context.Context, o options, servers []*server, peaks map[string]float64, facts *snapshot.FileFacts, factsVal any, out io.Writer) error {
	servers = slices.DeleteFunc(slices.Clone(servers), func(s *server) bool { return s.floor }) // it answers a canned grant only
	fmt.Fprintf(out, "\n## distinct stream at a fraction of peak, open loop (%s per run, %d rounds alternating; floor: GET /health on the same server at the same rate)\n\n", o.duration, o.rounds)
	fmt.Fprintf(out, "Latency is counted from the time each request was due. late p99: how late the sender itself started a request (a sender or its CPU was busy). "+
		"dials: connections opened during the runs (%d senders, client %s, prewarm %v). From the server's /metrics: its CPU (100 %% = one core), "+
		"the 99th percentile of how long its goroutines waited for a CPU (upper bound of its bucket; the worst run's; go_sched_latencies_seconds), its collections per second, their mean stop-the-world pause, and its allocation per request. "+
		"snd: the same of the sender (this program).\n\n", o.senders, o.client, o.prewarm)
	fmt.Fprintf(out, "| at | server | target req/s | sent req/s | p50 ms | p90 ms | p99 ms | p99 of each round | max ms | late p99 ms | dials | srv CPU %% | srv CPU ms/req | srv sched p99 µs | srv GC/s | srv pause µs | srv KiB/req | snd CPU %% | snd GC/s | snd sched p99 µs | errors |\n")
	fmt.Fprintf(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	next := 1 << 30 // distinct requests of the open-loop runs are numbered apart from the closed-loop ones
	for _, f := range o.pacedAt {
		results := map[string]*result{}
		rounds := map[string][]string{} // each round's p99
		for round := range o.rounds {
			order := slices.Clone(servers)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, s := range order {
				rate := peaks[s.name] * f
				n := int(rate*o.duration.Seconds()) + 1
				off := next
				next += n
				calls, err := prepare(ctx, facts, factsVal, n, func(i int) map[string]any { return distinctRequest(off + i) })
				if err != nil {
					return err
				}
				for _, stream := range []string{"distinct", "floor"} {
					key := s.name
					if stream == "floor" {
						key += " /health"
					}
					runtime.GC() // the sender's garbage of preparing stays out of the run
					r := paced(ctx, s, stream, calls, rate, o)
					rounds[key] = append(rounds[key], fmt.Sprintf("%.1f", r.pct(99)))
					if results[key] == nil {
						results[key] = &result{target: rate}
					}
					results[key].merge(r)
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
		}
		for _, s := range servers {
			for _, key := range []string{s.name, s.name + " /health"} {
				r := results[key]
				el := r.elapsed.Seconds()
				srvGC, pause, alloc := "—", "—", "—"
				if r.srvGCs >= 0 {
					srvGC = fmt.Sprintf("%.1f", float64(r.srvGCs)/el)
					alloc = fmt.Sprintf("%.1f", r.srvAlloc/1024/float64(max(1, r.n)))
					if r.srvGCs > 0 {
						pause = fmt.Sprintf("%.0f", r.srvPause.Seconds()*1e6/float64(r.srvGCs))
					}
				}
				sched := "—"
				if r.srvSched > 0 {
					sched = fmt.Sprintf("%.0f", r.srvSched*1e6)
				}
				fmt.Fprintf(out, "| %.0f%% | %s | %.0f | %.0f | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %d | %.0f | %.3f | %s | %s | %s | %s | %.0f | %.1f | %.0f | %d |\n",
					f*100, key, r.target, r.rate(), r.pct(50), r.pct(90), r.pct(99), strings.Join(rounds[key], " / "), r.pct(100), pctOf(r.late, 99), r.dials,
					100*r.srvCPU/el, 1000*r.srvCPU/float64(max(1, r.n)), sched, srvGC, pause, alloc, 100*r.sndCPU/el, float64(r.sndGCs)/el, r.sndSched*1e6, r.errors)
			}
		}
	}
	return nil
}

// timed is one request of an open-loop run: when it was due, how late the sender started it,
// how long from due until its answer was read, and the answer.
type timed struct {
	due     time.Time
	late    time.Duration
	latency time.Duration
	allow   bool
	err     error
}

// openLoop sends one request every 1/rate for d from senders goroutines, each request at its
// due time (or as soon as a sender is free, the wait counted in its latency), and returns every
// request in the order they were due. send answers allow for one request and the time its
// answer was read (zero: when send returned), so that checking the answer is not counted.
func openLoop(ctx context.Context, rate float64, d time.Duration, senders int, send func(ctx context.Context, sender, i int) (bool, time.Time, error)) []timed {
	n := int(rate * d.Seconds())
	if n < 1 {
		n = 1
	}
	interval := time.Duration(float64(time.Second) / rate)
	out := make([]timed, n)
	start := time.Now().Add(20 * time.Millisecond)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				due := start.Add(time.Duration(i) * interval)
				if w := time.Until(due); w > 0 {
					time.Sleep(w)
				}
				late := time.Since(due)
				allow, answered, err := send(ctx, w, i)
				if answered.IsZero() {
					answered = time.Now()
				}
				out[i] = timed{due: due, late: late, latency: answered.Sub(due), allow: allow, err: err}
			}
		})
	}
	wg.Wait()
	return out
}

// paced sends calls to s at rate for o.duration, open loop, checking every answer (stream
// "floor": GET /health at the same rate).
func paced(ctx context.Context, s *server, stream string, calls []call, rate float64, o options) *result {
	var dials atomic.Int64
	var send func(ctx context.Context, sender int, c call) (time.Time, error)
	if o.client == "raw" {
		conns := make([]*rawConn, o.senders)
		for w := range conns {
			conns[w] = &rawConn{s: s, dials: &dials}
			if o.prewarm {
				if err := conns[w].dial(ctx); err != nil {
					return &result{n: 1, errors: 1, srvGCs: -1}
				}
			}
		}
		defer func() {
			for _, r := range conns {
				r.close()
			}
		}()
		send = func(ctx context.Context, w int, c call) (time.Time, error) { return conns[w].send(ctx, stream, c) }
	} else {
		dialer := &net.Dialer{}
		tr := &http.Transport{MaxIdleConnsPerHost: o.senders, MaxConnsPerHost: o.senders, DisableCompression: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return dialer.DialContext(ctx, network, addr)
			}}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		if o.prewarm {
			prewarm(ctx, client, s.url, o.senders, &dials)
		}
		send = func(ctx context.Context, _ int, c call) (time.Time, error) {
			return s.sendTimed(ctx, client, stream, c)
		}
	}
	dials.Store(0)
	srv0, srvOK := s.scrape(ctx)
	snd0 := readSenderStats()
	began := time.Now()
	reqs := openLoop(ctx, rate, o.duration, o.senders, func(ctx context.Context, w, i int) (bool, time.Time, error) {
		c := calls[i%max(1, len(calls))]
		answered, err := send(ctx, w, c)
		return c.allow, answered, err
	})
	res := &result{elapsed: time.Since(began), target: rate, dials: int(dials.Load()), srvGCs: -1}
	snd := readSenderStats().since(snd0)
	res.sndGCs, res.sndSched, res.sndCPU = snd.gcs, snd.schedP99, snd.cpu
	if srv1, ok := s.scrape(ctx); ok && srvOK {
		res.srvGCs, res.srvPause, res.srvAlloc = srv1.gcs-srv0.gcs, srv1.pause-srv0.pause, srv1.alloc-srv0.alloc
		res.srvCPU, res.srvSched = srv1.cpu-srv0.cpu, srv1.schedP99(srv0)
	}
	for _, r := range reqs {
		if r.due.IsZero() {
			continue
		}
		res.n++
		res.lat = append(res.lat, r.latency)
		res.late = append(res.late, r.late)
		if r.err != nil {
			res.errors++
			if res.errors <= 3 {
				fmt.Fprintf(os.Stderr, "%s paced %s: %v\n", s.name, stream, r.err)
			}
		}
	}
	return res
}

// prewarm opens n keep-alive connections of client to base: rounds of n concurrent GET /health
// until n were dialled (or ten rounds).
func prewarm(ctx context.Context, client *http.Client, base string, n int, dials *atomic.Int64) {
	for range 10 {
		if int(dials.Load()) >= n || ctx.Err() != nil {
			return
		}
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-gate
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
				if err != nil {
					return
				}
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		close(gate)
		wg.Wait()
	}
}

// serverStats are a server's runtime figures from its Prometheus metrics.
type serverStats struct {
	gcs   int                 // go_gc_duration_seconds_count
	pause time.Duration       // go_gc_duration_seconds_sum: stop-the-world
	alloc float64             // go_memstats_alloc_bytes_total
	cpu   float64             // process_cpu_seconds_total
	sched map[float64]float64 // go_sched_latencies_seconds_bucket (authz only): le → cumulative count
}

// scrape reads s's /metrics; ok is false when it has no Go collector figures.
func (s *server) scrape(ctx context.Context) (st serverStats, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/metrics", nil)
	if err != nil {
		return st, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return st, false
	}
	st.cpu = cpuSeconds(s.cmd.Process.Pid)
	var haveCount, haveSum bool
	for _, l := range strings.Split(string(body), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch name, labels, _ := strings.Cut(f[0], "{"); name {
		case "go_gc_duration_seconds_count":
			st.gcs, haveCount = int(v), true
		case "go_gc_duration_seconds_sum":
			st.pause, haveSum = time.Duration(v*float64(time.Second)), true
		case "go_memstats_alloc_bytes_total":
			st.alloc = v
		case "go_sched_latencies_seconds_bucket":
			le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(labels, `le="`), `"}`), 64)
			if err == nil {
				if st.sched == nil {
					st.sched = map[float64]float64{}
				}
				st.sched[le] = v
			}
		}
	}
	return st, haveCount && haveSum
}

// schedP99 is the upper bound of the bucket of the 99th percentile of the scheduling latencies
// between old and st, in seconds (0: unknown).
func (st serverStats) schedP99(old serverStats) float64 {
	if st.sched == nil || old.sched == nil {
		return 0
	}
	les := slices.Sorted(maps.Keys(st.sched))
	total := st.sched[math.Inf(1)] - old.sched[math.Inf(1)]
	if total <= 0 {
		return 0
	}
	for _, le := range les {
		if st.sched[le]-old.sched[le] >= total*0.99 {
			if math.IsInf(le, 1) {
				return les[max(0, len(les)-2)]
			}
			return le
		}
	}
	return 0
}

// senderStats are the sender's own runtime figures (runtime/metrics).
type senderStats struct {
	cpu      float64 // user and system seconds
	gcs      int
	sched    *metrics.Float64Histogram
	schedP99 float64 // seconds, of the interval (since)
}

func readSenderStats() senderStats {
	m := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/latencies:seconds"}}
	metrics.Read(m)
	st := senderStats{}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		st.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	if m[0].Value.Kind() == metrics.KindUint64 {
		st.gcs = int(m[0].Value.Uint64())
	}
	if m[1].Value.Kind() == metrics.KindFloat64Histogram {
		st.sched = m[1].Value.Float64Histogram()
	}
	return st
}

// since is the difference of two readings: the collections in between and the 99th percentile of
// the scheduling latencies in between (the upper bound of its bucket).
func (st senderStats) since(old senderStats) senderStats {
	d := senderStats{gcs: st.gcs - old.gcs, cpu: st.cpu - old.cpu}
	if st.sched == nil || old.sched == nil || len(st.sched.Counts) != len(old.sched.Counts) {
		return d
	}
	counts := make([]uint64, len(st.sched.Counts))
	var total uint64
	for i := range counts {
		counts[i] = st.sched.Counts[i] - old.sched.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		return d
	}
	want := total - total/100
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= want {
			d.schedP99 = st.sched.Buckets[i+1]
			if math.IsInf(d.schedP99, 1) {
				d.schedP99 = st.sched.Buckets[i]
			}
			break
		}
	}
	return d
}

// restartRun starts `authz serve` with the built-in example driver, sends the example grant at a
// fixed rate, kills the driver's worker a second in, and reports the latency and answers before
// the kill, from the kill until the first grant after it, and after that.
func restartRun(ctx context.Context, authzBin, root string, out io.Writer) error {
	const rate, total = 200.0, 6 * time.Second
	s := &server{name: "authz (example driver)", cmd: exec.Command(authzBin, "serve", "--log-level", "error")}
	if err := s.start(ctx); err != nil {
		return err
	}
	defer stopAll([]*server{s})
	body, err := os.ReadFile(filepath.Join(root, "examples", "grant.json"))
	if err != nil {
		return err
	}
	pid, err := workerPID(ctx, s.url)
	if err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var killed atomic.Int64 // unix nanoseconds of the kill
	go func() {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
		killed.Store(time.Now().UnixNano())
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}()
	reqs := openLoop(ctx, rate, total, 64, func(ctx context.Context, _, _ int) (bool, time.Time, error) {
		allow, err := authorize(ctx, client, s.url, body)
		return allow, time.Time{}, err
	})
	k := time.Unix(0, killed.Load())
	if killed.Load() == 0 {
		return errors.New("the worker was not killed")
	}
	// The first deny after the kill, and the first grant after that deny.
	firstDeny, regrant := time.Time{}, time.Time{}
	for _, r := range reqs {
		switch {
		case r.due.IsZero() || r.due.Before(k) || r.err != nil:
		case firstDeny.IsZero() && !r.allow:
			firstDeny = r.due
		case !firstDeny.IsZero() && r.allow:
			regrant = r.due
		}
		if !regrant.IsZero() {
			break
		}
	}
	phases := []struct {
		name     string
		from, to time.Time
	}{
		{"before the kill", time.Time{}, k},
		{"kill → first grant again", k, regrant},
		{"after", regrant, time.Now().Add(time.Hour)},
	}
	if regrant.IsZero() {
		phases[1].to = time.Now().Add(time.Hour)
		phases = phases[:2]
	}
	fmt.Fprintf(out, "\n## worker restart under load: example grant at %.0f req/s, open loop, SIGKILL to the driver's worker (pid %d) after 1 s\n\n", rate, pid)
	if firstDeny.IsZero() {
		fmt.Fprintf(out, "No request due after the kill was denied.\n\n")
	} else if regrant.IsZero() {
		fmt.Fprintf(out, "First deny due %.1f ms after the kill; no grant again within the run.\n\n", float64(firstDeny.Sub(k).Microseconds())/1000)
	} else {
		fmt.Fprintf(out, "First deny due %.1f ms after the kill; first grant again due %.1f ms after the kill.\n\n",
			float64(firstDeny.Sub(k).Microseconds())/1000, float64(regrant.Sub(k).Microseconds())/1000)
	}
	fmt.Fprintf(out, "| phase | span ms | requests | granted | denied | errors | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, ph := range phases {
		r := &result{}
		granted, denied := 0, 0
		for _, q := range reqs {
			if q.due.IsZero() || q.due.Before(ph.from) || !q.due.Before(ph.to) {
				continue
			}
			r.n++
			r.lat = append(r.lat, q.latency)
			switch {
			case q.err != nil:
				r.errors++
			case q.allow:
				granted++
			default:
				denied++
			}
		}
		span := "—"
		if !ph.from.IsZero() && ph.to.Before(time.Now()) {
			span = fmt.Sprintf("%.0f", float64(ph.to.Sub(ph.from).Microseconds())/1000)
		}
		fmt.Fprintf(out, "| %s | %s | %d | %d | %d | %d | %.2f | %.2f | %.2f |\n", ph.name, span, r.n, granted, denied, r.errors, r.pct(50), r.pct(99), r.pct(100))
	}
	return nil
}

// authorize posts body to /v1/authorize and returns the answer's allow.
func authorize(ctx context.Context, client *http.Client, base string, body []byte) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/authorize", bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var doc struct {
		Allow *bool `json:"allow"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK || doc.Allow == nil {
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	return *doc.Allow, nil
}

// workerPID asks the service for its one running worker's process id.
func workerPID(ctx context.Context, base string) (int, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/plugins", nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		var ps struct {
			Plugins []struct {
				Worker *struct {
					PID int `json:"pid"`
				} `json:"worker"`
			} `json:"plugins"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ps)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, p := range ps.Plugins {
			if p.Worker != nil && p.Worker.PID > 0 {
				return p.Worker.PID, nil
			}
		}
	}
	return 0, errors.New("the service reported no running worker within 30s")
}

// makeFacts: ten plugins with thirty sandbox providers each (the replay leases pin them), and
// one plugin driver for the distinct stream; every worker verifies every method.
func makeFacts(leases int) map[string]any {
	methods := []any{"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease", "environmentSyncIn",
		"environmentSyncOut", "environmentExecute", "duplexChannelOpen", "environmentRunnerIngressEndpoint"}
	var plugins []any
	workers := map[string]any{}
	for p := range 10 {
		var entries []any
		for i := p; i < leases; i += 10 {
			entries = append(entries, map[string]any{"driverKey": fmt.Sprintf("prov-%d", i), "kind": "sandbox_provider",
				"sandboxCapabilities": map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true}})
		}
		id := fmt.Sprintf("plugin-%d", p)
		plugins = append(plugins, map[string]any{"id": id, "key": "acme." + id, "status": "ready",
			"manifest": map[string]any{"environmentDrivers": entries}})
		workers[id] = map[string]any{"supportedMethods": methods}
	}
	plugins = append(plugins, map[string]any{"id": "driver.plugin", "key": "acme.driver", "status": "ready",
		"manifest": map[string]any{"environmentDrivers": []any{map[string]any{"driverKey": "dk", "kind": "environment_driver",
			"sandboxCapabilities": map[string]any{"duplexCommandStream": true}}}}})
	workers["driver.plugin"] = map[string]any{"supportedMethods": methods}
	return map[string]any{"plugins": plugins, "workers": workers, "builtinProviders": map[string]any{"fake": map[string]any{"execute": true}}}
}

// replayRequest is lease i of the replay stream: a plugin-backed sandbox lease on its own
// provider, with its lease policy and backend.
func replayRequest(i, leases int) map[string]any {
	i %= leases
	md := map[string]any{"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": fmt.Sprintf("plugin-%d", i%10),
		"provider": fmt.Sprintf("prov-%d", i)}
	if i%3 == 0 {
		md["backend"] = "job"
	}
	policies := []string{"ephemeral", "reuse_by_environment", "reuse_by_execution_workspace", "retain_on_failure"}
	return map[string]any{
		"operation":   "openDuplexChannel",
		"environment": map[string]any{"id": fmt.Sprintf("env-%d", i), "driver": "sandbox", "config": map[string]any{"provider": md["provider"]}},
		"lease": map[string]any{"id": fmt.Sprintf("lease-%d", i), "companyId": "company-1", "leasePolicy": policies[i%4],
			"providerLeaseId": fmt.Sprintf("pl-%d", i), "metadata": md},
		"command": []any{"sh", "-c", "echo hi"},
	}
}

// distinctRequest is request i of the distinct stream: a lease on the plugin driver whose
// metadata carries a provider of its own, which the policy reads (so no two share a cache key);
// one in ten is on the local driver, a deny.
func distinctRequest(i int) map[string]any {
	md := map[string]any{"driver": "plugin", "pluginId": "driver.plugin", "driverKey": "dk", "provider": fmt.Sprintf("unique-%d", i)}
	if i%10 == 9 {
		md["driver"] = "local"
	}
	return map[string]any{
		"operation":   "openDuplexChannel",
		"environment": map[string]any{"id": fmt.Sprintf("env-%d", i), "driver": "plugin"},
		"lease":       map[string]any{"id": fmt.Sprintf("lease-%d", i), "leasePolicy": "ephemeral", "metadata": md},
	}
}

// prepare builds n calls: the request body, the input authz assembles from it, and the oracle's
// answer.
func prepare(ctx context.Context, facts *snapshot.FileFacts, factsVal any, n int, req func(int) map[string]any) ([]call, error) {
	calls := make([]call, n)
	factsRT := roundTrip(factsVal)
	for i := range calls {
		body, _ := json.Marshal(req(i))
		r, err := snapshot.ParseRequest(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		in := snapshot.Build(ctx, r, facts, snapshot.Options{})
		opaBody, _ := json.Marshal(map[string]any{"input": in})
		want, err := specoracle.Decide(roundTrip(req(i)), factsRT)
		if err != nil {
			return nil, err
		}
		calls[i] = call{authzBody: body, opaBody: opaBody, allow: want.Allow, code: want.Code}
	}
	return calls, nil
}

func roundTrip(v any) any {
	b, _ := json.Marshal(v)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	_ = dec.Decode(&out)
	return out
}

// checkPrintInput checks that the input sent to OPA is what `authz decide --print-input`
// prints for the same request (now_ns aside).
func checkPrintInput(ctx context.Context, bin, factsFile string, c call, req map[string]any, _ *snapshot.FileFacts) error {
	body, _ := json.Marshal(req)
	cmd := exec.CommandContext(ctx, bin, "decide", "--facts", factsFile, "--print-input")
	cmd.Stdin = bytes.NewReader(body)
	printed, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("authz decide --print-input: %w", err)
	}
	var a, b map[string]any
	if err := json.Unmarshal(printed, &a); err != nil {
		return err
	}
	var wrapped struct{ Input map[string]any }
	if err := json.Unmarshal(c.opaBody, &wrapped); err != nil {
		return err
	}
	b = wrapped.Input
	delete(a, "now_ns")
	delete(b, "now_ns")
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		return fmt.Errorf("the input sent to OPA differs from authz decide --print-input:\n%s\n%s", ja, jb)
	}
	return nil
}

type result struct {
	n, errors int
	elapsed   time.Duration
	lat       []time.Duration

	// Of open-loop runs only.
	target   float64         // the rate asked for
	late     []time.Duration // how late the sender started each request
	dials    int             // connections dialled during the run
	srvGCs   int             // the server's collections during the run; -1: unknown
	srvPause time.Duration   // their total stop-the-world pause
	srvAlloc float64         // the bytes the server allocated during the run
	srvCPU   float64         // the server's CPU seconds during the run
	srvSched float64         // the server's 99th percentile scheduling latency, seconds (authz only; the worst run's)
	sndCPU   float64         // the sender's CPU seconds during the run
	sndGCs   int             // the sender's collections during the run
	sndSched float64         // the sender's 99th percentile scheduling latency, seconds (the worst run's)
}

func (r *result) merge(o *result) {
	r.n += o.n
	r.errors += o.errors
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
	r.late = append(r.late, o.late...)
	r.dials += o.dials
	if r.srvGCs < 0 || o.srvGCs < 0 {
		r.srvGCs = -1
	} else {
		r.srvGCs += o.srvGCs
	}
	r.srvPause += o.srvPause
	r.srvAlloc += o.srvAlloc
	r.srvCPU += o.srvCPU
	r.srvSched = max(r.srvSched, o.srvSched)
	r.sndCPU += o.sndCPU
	r.sndGCs += o.sndGCs
	r.sndSched = max(r.sndSched, o.sndSched)
}

func (r *result) rate() float64 {
	if r == nil || r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

func (r *result) pct(p int) float64 { return pctOf(r.lat, p) }

// pctOf is the p-th percentile of lat in milliseconds (sorting lat).
func pctOf(lat []time.Duration, p int) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return float64(lat[(len(lat)-1)*p/100].Microseconds()) / 1000
}

// load sends calls to s from conns connections for d (or until the calls run out when once is
// set), checking every answer.
func load(ctx context.Context, s *server, stream string, calls []call, conns int, d time.Duration, once bool) *result {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var next atomic.Int64
	var mu sync.Mutex
	res := &result{}
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			n, errs := 0, 0
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if once && i >= len(calls) {
					break
				}
				var c call
				if len(calls) > 0 {
					c = calls[i%len(calls)]
				}
				t0 := time.Now()
				err := s.send(ctx, client, stream, c)
				if ctx.Err() != nil {
					break
				}
				lat = append(lat, time.Since(t0))
				n++
				if err != nil {
					errs++
					if errs <= 3 {
						fmt.Fprintf(os.Stderr, "%s %s: %v\n", s.name, stream, err)
					}
				}
			}
			mu.Lock()
			res.n += n
			res.errors += errs
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

func (s *server) send(ctx context.Context, client *http.Client, stream string, c call) error {
	_, err := s.sendTimed(ctx, client, stream, c)
	return err
}

// sendTimed sends c (or GET /health for stream "floor"), reads the answer, notes the time it
// was read, and then checks it against the oracle.
func (s *server) sendTimed(ctx context.Context, client *http.Client, stream string, c call) (answered time.Time, err error) {
	var req *http.Request
	switch {
	case stream == "floor":
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/health", nil)
	case s.opa:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/data/authz/decision", bytes.NewReader(c.opaBody))
	default:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/authorize", bytes.NewReader(c.authzBody))
	}
	if err != nil {
		return answered, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answered, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	answered = time.Now()
	if err != nil {
		return answered, err
	}
	return answered, s.check(stream, c, resp.StatusCode, body)
}

// rawConn is one sender's own keep-alive connection of the open-loop run: the request is
// written in one call and the answer read with http.ReadResponse, without http.Transport's
// pool, goroutines and channels, so the sender costs the machine less than the server it
// measures.
type rawConn struct {
	s     *server
	dials *atomic.Int64
	conn  net.Conn
	br    *bufio.Reader
	buf   []byte
}

func (r *rawConn) dial(ctx context.Context) error {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", r.host())
	if err != nil {
		return err
	}
	r.dials.Add(1)
	r.conn, r.br = conn, bufio.NewReaderSize(conn, 16<<10)
	return nil
}

func (r *rawConn) host() string { return strings.TrimPrefix(r.s.url, "http://") }

// send sends c (GET /health for stream "floor") and reads the answer; answered is when it was
// read. On an error the connection is closed and the next send dials a new one.
func (r *rawConn) send(ctx context.Context, stream string, c call) (answered time.Time, err error) {
	if r.conn == nil {
		if err := r.dial(ctx); err != nil {
			return time.Now(), err
		}
	}
	method, path, body := http.MethodPost, "/v1/authorize", c.authzBody
	switch {
	case stream == "floor":
		method, path, body = http.MethodGet, "/health", nil
	case r.s.opa:
		path, body = "/v1/data/authz/decision", c.opaBody
	}
	r.buf = fmt.Appendf(r.buf[:0], "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, r.host())
	if body != nil {
		r.buf = fmt.Appendf(r.buf, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	r.buf = append(append(r.buf, "\r\n"...), body...)
	if dl, ok := ctx.Deadline(); ok {
		_ = r.conn.SetDeadline(dl)
	} else {
		_ = r.conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	resp, err := r.write()
	if err != nil {
		r.close()
		return time.Now(), err
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	answered = time.Now()
	if err != nil || resp.Close {
		r.close()
	}
	if err != nil {
		return answered, err
	}
	return answered, r.s.check(stream, c, resp.StatusCode, got)
}

func (r *rawConn) write() (*http.Response, error) {
	if _, err := r.conn.Write(r.buf); err != nil {
		return nil, err
	}
	return http.ReadResponse(r.br, nil)
}

func (r *rawConn) close() {
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// check checks an answer of s against the oracle's for c.
func (s *server) check(stream string, c call, status int, body []byte) error {
	if status != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", status, body)
	}
	if stream == "floor" {
		return nil
	}
	var doc struct {
		Allow *bool  `json:"allow"`
		Code  string `json:"code"`
	}
	if s.opa {
		var wrapped struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(body, &wrapped); err != nil {
			return err
		}
		body = wrapped.Result
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return err
	}
	if doc.Allow == nil || *doc.Allow != c.allow || doc.Code != c.code {
		return fmt.Errorf("answer %.200s, want allow %v code %q", body, c.allow, c.code)
	}
	return nil
}

func (s *server) start(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s.cmd.Args = append(s.cmd.Args, "--addr", addr)
	s.cmd.Stderr = os.Stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.url = "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := http.Get(s.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer /health on %s within 60s", s.name, addr)
}

func stopAll(servers []*server) {
	for _, s := range servers {
		if s.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}

// serverCmd is the command that runs bin with args, under taskset when --server-cpus is set.
func (o options) serverCmd(bin string, args ...string) *exec.Cmd {
	if o.serverCPUs == "" {
		return exec.Command(bin, args...)
	}
	return exec.Command("taskset", append([]string{"-c", o.serverCPUs, bin}, args...)...)
}

// pinSender applies --sender-procs and --sender-cpus to this process: every thread it has now
// (the runtime's later threads inherit the mask of the thread that creates them).
func (o options) pinSender() error {
	if o.senderProcs > 0 {
		runtime.GOMAXPROCS(o.senderProcs)
	}
	if len(o.senderCPUs) == 0 {
		return nil
	}
	var set unix.CPUSet
	for _, c := range o.senderCPUs {
		set.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("--sender-cpus: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("--sender-cpus: pin thread %d: %w", tid, err)
		}
	}
	return nil
}

func orAll(cpus string) string {
	if cpus == "" {
		return "all"
	}
	return cpus
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cpuSeconds reads the user and system CPU time of pid (0 when it cannot).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

// rss reads the resident and peak resident memory of pid in MiB.
func rss(pid int) (now, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			now = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return now, peak
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run compare-opa inside the authz module")
	}
	return filepath.Dir(mod), nil
}

func command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	return cmd
}

// serveFloor is the HTTP floor (--servers floor): net/http on --addr that answers GET /health,
// and any POST by reading and JSON-decoding its body and answering the canned decision --answer.
// It stops on SIGTERM or SIGINT.
func serveFloor(args []string) int {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "where it listens")
	answer := fs.String("answer", `{"allow":true}`, "the canned decision it answers")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	canned := []byte(*answer)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var doc any
		if err == nil {
			err = json.Unmarshal(body, &doc)
		}
		if err != nil {
			http.Error(w, `{"allow":false}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(canned)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "compare-opa floor:", err)
		return 1
	}
	return 0
}
