package server

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/policystate"
	"github.com/authz-dev/authz/internal/snapshot"
)

// admission bounds the decision requests in progress, in two stages. A request is admitted
// (a reading place) before a byte of its body is read, and holds the place until it is
// answered: so at most maxReading bodies are in memory. It then takes a deciding place for
// decoding, evaluating and logging, where memory grows in proportion to the body: at most
// maxDeciding at once. A driver's config check is waited for outside the deciding place,
// holding nothing that grows with the body (Server.admitted). A request that waits longer than
// queueWait for a place is answered 503.
//
// Places are shared fairly between callers (callerOf): a place that comes free goes to the
// waiting caller that holds fewest, and a caller that holds more reading places than its share
// (maxReading over the callers holding or waiting) has its newest body still being read cut
// when another caller waits, so that one caller's slow bodies never shut the others out. A
// single caller keeps every place. A body that comes slower than minBodyRate after the grace
// of bodyGrace is cut too (408): slowness costs the sender its place, not the service.
//
// A decision cannot be cut, so the deciding places keep one for the others: a caller does not
// take the last free deciding place while it holds all the others and another caller took one
// within otherCallerWindow. One caller's slow decisions (a 1 MiB body can take a second) then
// never hold every deciding place while others are deciding too, and another caller's request
// does not wait queueWait behind them for a 503. A caller alone keeps every place.
type admission struct {
	reading, deciding *places
	// decoding is the budget of bytes of bodies decoded at once: one largest body
	// (maxBodyBytes). A decoded body costs up to decidingBytesPerBodyByte times its size, so
	// the bytes, not the number of deciding places, bound what the requests being decided
	// hold: small requests are decided maxDeciding at once, two largest ones one after the
	// other. A request takes its share before its deciding place.
	decoding    *semaphore.Weighted
	decodingCap int64
	wait        time.Duration
	minRate     float64 // bytes a second
	grace       time.Duration

	watchdog bool // a goroutine checks the bodies' rates; under reading.mu
}

func newAdmission(c LimitsConfig, maxBodyBytes int64) *admission {
	decodingCap := max(maxBodyBytes, 1)
	a := &admission{
		reading:     newPlaces(c.MaxReading),
		deciding:    newPlaces(c.MaxDeciding),
		decoding:    semaphore.NewWeighted(decodingCap),
		decodingCap: decodingCap,
		wait:        c.QueueWait,
		minRate:     float64(c.MinBodyRate),
		grace:       c.BodyGrace,
	}
	a.reading.bodies = true
	a.deciding.keepOne = true
	return a
}

// otherCallerWindow is how long after another caller took a deciding place a caller holding
// all the others does not take the last one.
const otherCallerWindow = 10 * time.Second

// places is a bounded number of places shared between callers.
type places struct {
	mu       sync.Mutex
	capacity int
	held     int
	byCaller map[string]int
	waiters  []*placeWaiter
	// bodies: the holders are tracked (newest last) so that a body may be cut.
	bodies      bool
	first, last *bodyHold
	cutsPending int
	// keepOne: a caller holding every other place does not take the last one while another
	// caller took one within otherCallerWindow (mayTakeLocked). latest is the caller that took
	// a place last (when anyone did), otherAt when a caller other than latest last took one
	// (zero when none did): the clock is read only when the caller changes.
	keepOne bool
	latest  string
	anyone  bool
	otherAt time.Time
}

type placeWaiter struct {
	caller  string
	granted chan struct{} // receives once the place is this waiter's
}

func newPlaces(capacity int) *places {
	return &places{capacity: capacity, byCaller: map[string]int{}}
}

// acquire takes a place for caller within the admission wait, cutting a body of a caller over
// its share to make room when p holds bodies. It reports false when none came free in time or
// ctx ended. h, when not nil, is the body that holds the place (one lock for both).
func (a *admission) acquire(ctx context.Context, p *places, caller string, h *bodyHold) bool {
	p.mu.Lock()
	// Waiters with a place free are callers kept from the last one: they do not hold others up.
	if (len(p.waiters) == 0 || p.keepOne) && p.mayTakeLocked(caller) {
		p.takeLocked(caller)
		a.trackLocked(p, h)
		p.mu.Unlock()
		return true
	}
	if p.bodies {
		p.cutForLocked(caller)
	}
	w := &placeWaiter{caller: caller, granted: make(chan struct{}, 1)}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()

	t := time.NewTimer(a.wait)
	defer t.Stop()
	got := false
	select {
	case <-w.granted:
		got = true
	case <-t.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !got {
		select {
		case <-w.granted: // granted as the wait ended: keep it
		default:
			for i, o := range p.waiters {
				if o == w {
					p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
					break
				}
			}
			return false
		}
	}
	a.trackLocked(p, h)
	return true
}

// acquireDecoding takes n bytes of the budget of bytes decoded at once within the admission
// wait (all of it when n is more: such a request is decoded alone); it reports false when they
// did not come free in time or ctx ended. It returns what it took, to give back with
// releaseDecoding.
func (a *admission) acquireDecoding(ctx context.Context, n int64) (int64, bool) {
	n = min(n, a.decodingCap)
	if n <= 0 {
		return 0, true
	}
	if a.decoding.TryAcquire(n) {
		return n, true
	}
	wctx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	if a.decoding.Acquire(wctx, n) != nil {
		return 0, false
	}
	return n, true
}

// releaseDecoding gives back what acquireDecoding took.
func (a *admission) releaseDecoding(n int64) {
	if n > 0 {
		a.decoding.Release(n)
	}
}

// trackLocked adds h (when not nil) to the bodies being read, newest last, and starts the rate
// watchdog when it is not running. Under p.mu.
func (a *admission) trackLocked(p *places, h *bodyHold) {
	if h == nil {
		return
	}
	h.prev = p.last
	if p.last != nil {
		p.last.next = h
	} else {
		p.first = h
	}
	p.last = h
	if !a.watchdog && a.minRate > 0 {
		a.watchdog = true
		go a.watchRates()
	}
}

// release gives caller's place back: to the waiting caller that holds fewest places (the
// longest waiting of them), else to the free places.
func (p *places) release(caller string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(caller)
}

func (p *places) releaseLocked(caller string) {
	if n := p.byCaller[caller] - 1; n > 0 {
		p.byCaller[caller] = n
	} else {
		delete(p.byCaller, caller)
	}
	p.held--
	if len(p.waiters) == 0 {
		return
	}
	best := -1
	for i, w := range p.waiters {
		if (best < 0 || p.byCaller[w.caller] < p.byCaller[p.waiters[best].caller]) && p.mayTakeLocked(w.caller) {
			best = i
		}
	}
	if best < 0 {
		return // the waiters are kept from the last place: it stays free for another caller
	}
	w := p.waiters[best]
	p.waiters = append(p.waiters[:best], p.waiters[best+1:]...)
	p.takeLocked(w.caller)
	w.granted <- struct{}{}
}

// mayTakeLocked reports whether caller may take a place now: one is free and, for keepOne
// places, it is not the last one while caller holds all the others and another caller took
// one within otherCallerWindow.
func (p *places) mayTakeLocked(caller string) bool {
	if p.held >= p.capacity {
		return false
	}
	if !p.keepOne || p.capacity < 2 || p.held < p.capacity-1 || p.byCaller[caller] < p.held {
		return true
	}
	// caller holds every other place: keep the last for another caller seen lately.
	if !p.anyone || p.otherAt.IsZero() {
		return true // no other caller took one yet
	}
	if caller != p.latest {
		return false // another caller took a place after caller's places were taken
	}
	return time.Since(p.otherAt) >= otherCallerWindow
}

// takeLocked gives caller a place.
func (p *places) takeLocked(caller string) {
	p.held++
	p.byCaller[caller]++
	if p.keepOne && (!p.anyone || caller != p.latest) {
		if p.anyone {
			p.otherAt = time.Now()
		}
		p.latest, p.anyone = caller, true
	}
}

// cutForLocked makes room for caller, who waits: when caller holds less than its share and
// another caller holds more than its own, that caller's newest body still being read is cut.
// Cuts already under way count as room being made.
func (p *places) cutForLocked(caller string) {
	callers := len(p.byCaller)
	if p.byCaller[caller] == 0 {
		callers++
	}
	seen := map[string]bool{}
	for _, w := range p.waiters {
		if p.byCaller[w.caller] == 0 && w.caller != caller && !seen[w.caller] {
			seen[w.caller] = true
			callers++
		}
	}
	share := max(1, p.capacity/callers)
	if p.byCaller[caller] >= share {
		return
	}
	// Room already being made for the waiters under their share.
	under := 1
	for _, w := range p.waiters {
		if p.byCaller[w.caller] < share {
			under++
		}
	}
	if p.cutsPending >= under {
		return
	}
	var victim *bodyHold
	for h := p.last; h != nil; h = h.prev {
		if h.state.Load() != bodyReading || p.byCaller[h.caller] <= share {
			continue
		}
		if victim == nil || p.byCaller[h.caller] > p.byCaller[victim.caller] {
			victim = h
		}
	}
	if victim != nil && victim.cutLocked(cutShare) {
		p.cutsPending++
	}
}

// The states of a body being read (bodyHold.state): reading, in, or why it was cut.
const (
	bodyReading = iota
	bodyIn
	cutShare = pipeline.CutShare // its caller held more than its share while another caller waited
	cutSlow  = pipeline.CutSlow  // it came slower than limits.minBodyRate after limits.bodyGrace
)

// bodyHold is a reading place held by a request: its body, read through it, and how much of
// it came.
type bodyHold struct {
	caller string
	w      http.ResponseWriter
	body   io.ReadCloser
	start  time.Time
	n      atomic.Int64
	// state goes from bodyReading to bodyIn (the body is in: it is not cut any more) or to why
	// it was cut, once.
	state      atomic.Int32
	prev, next *bodyHold // under places.mu
	// hc is the request's caller of the decision pipeline (steps.go), kept here so that a
	// decision costs no allocation of its own for it.
	hc httpCaller
}

var bodyHolds = sync.Pool{New: func() any { return new(bodyHold) }}

func (h *bodyHold) Read(b []byte) (int, error) {
	n, err := h.body.Read(b)
	h.n.Add(int64(n))
	return n, err
}

func (h *bodyHold) Close() error { return h.body.Close() }

// cutLocked ends the body's reading now, unless it is in: its next or pending read fails (a
// read deadline in the past, on the connection under HTTP/1, on the stream under HTTP/2).
// Under places.mu, which finish takes before the request's handler returns: w is still valid.
func (h *bodyHold) cutLocked(why int32) bool {
	if !h.state.CompareAndSwap(bodyReading, why) {
		return false
	}
	_ = http.NewResponseController(h.w).SetReadDeadline(time.Unix(1, 0))
	return true
}

// newBodyHold is a hold from the pool, for one request (Server.caller).
func newBodyHold() *bodyHold {
	h, _ := bodyHolds.Get().(*bodyHold)
	return h
}

// admitBody takes a reading place for r's body with h, read from then on through the place
// (r.Body is replaced until finish). It reports false when no place came in time; h is then not
// put back in the pool (its caller may still be read) and is left to the collector.
func (a *admission) admitBody(h *bodyHold, w http.ResponseWriter, r *http.Request, caller string) bool {
	h.caller, h.w, h.body, h.start = caller, w, r.Body, time.Now()
	h.n.Store(0)
	h.state.Store(bodyReading)
	if !a.acquire(r.Context(), a.reading, caller, h) {
		h.caller, h.w, h.body = "", nil, nil
		return false
	}
	r.Body = h
	return true
}

// bodyIn marks the body read: it is not cut any more. It reports why it was cut before, 0
// when it was not.
func (a *admission) bodyIn(h *bodyHold) int32 {
	if h.state.CompareAndSwap(bodyReading, bodyIn) {
		return 0
	}
	return h.state.Load()
}

// finish gives the reading place back and r its body.
func (a *admission) finish(r *http.Request, h *bodyHold) {
	p := a.reading
	r.Body = h.body
	p.mu.Lock()
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		p.first = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		p.last = h.prev
	}
	if h.state.Load() == cutShare {
		p.cutsPending--
	}
	p.releaseLocked(h.caller)
	h.caller, h.w, h.body, h.prev, h.next = "", nil, nil, nil, nil
	h.hc = httpCaller{}
	p.mu.Unlock()
	bodyHolds.Put(h)
}

// rateTick is how often the bodies being read are checked against limits.minBodyRate.
const rateTick = 100 * time.Millisecond

// watchRates cuts the bodies that come slower than the minimum rate after the grace, while
// there are bodies being read; one goroutine for all of them.
func (a *admission) watchRates() {
	t := time.NewTicker(rateTick)
	defer t.Stop()
	for range t.C {
		p := a.reading
		p.mu.Lock()
		if p.first == nil {
			a.watchdog = false
			p.mu.Unlock()
			return
		}
		now := time.Now()
		for h := p.first; h != nil; h = h.next {
			if h.state.Load() != bodyReading {
				continue
			}
			allowed := a.grace + time.Duration(float64(h.n.Load())/a.minRate*float64(time.Second))
			if now.Sub(h.start) > allowed {
				h.cutLocked(cutSlow)
			}
		}
		p.mu.Unlock()
	}
}

// cutError is the answer to a body that was cut.
func (a *admission) cutError(why int32) error {
	if why == cutSlow {
		return coded.Errorf(coded.RequestTimeout,
			"the request body came slower than %d bytes a second after %v (limits.minBodyRate, limits.bodyGrace): send it at once", int(a.minRate), a.grace)
	}
	return a.overloaded()
}

// retryAfter is the Retry-After of an overload answer: the admission wait in whole seconds,
// at least 1.
func (a *admission) retryAfter() string {
	return strconv.Itoa(max(1, int(math.Ceil(a.wait.Seconds()))))
}

// overloaded is the answer to a decision request that was not admitted.
func (a *admission) overloaded() error {
	return coded.Errorf(coded.Overloaded,
		"the service is deciding as many requests as it is configured to hold (limits.maxReading, limits.maxDeciding); retry after the time in Retry-After")
}

// Memory model of the service, measured for docs/service.md ("Limits and memory"). Live memory:
// the service with its policy loaded (about 27 MiB measured with the embedded policy), the
// decision cache filled to its bound, a bundle being read before it is verified, OPA's
// decision-log buffer at its default bound, every admitted body, the bodies being decoded and
// decided (at most maxBodyBytes of them at once, each costing up to
// snapshot.DecodedBytesPerBodyByte per byte; the embedded policy reads no member of the
// request, so none of it is converted for OPA), the read buffers of every open connection, and
// the open watches. The service sets the Go runtime's soft memory limit to
// that sum (MemoryLimit); the resident memory may pass it by the garbage the collector has not
// returned yet, which on busy CPUs (the collector takes at most half of them) was up to a
// fifth of it: the bound leaves a third.
const (
	// watchBytes is one open watch besides its connection and its request's body: its state in
	// the hub, its stream's goroutine and timer, the last decision it was sent.
	watchBytes               = 4 << 10
	baseResidentBytes        = 32 << 20
	decidingBytesPerBodyByte = snapshot.DecodedBytesPerBodyByte
	connectionBufferBytes    = 8 << 10
)

// MemoryLimit is the live memory the service holds at most, for the limits of c and the
// default bounds of the decision cache, bundles and OPA's decision-log buffer: `authz serve`
// sets the Go runtime's soft memory limit to it (unless GOMEMLIMIT is set).
func (c Config) MemoryLimit() int64 {
	return baseResidentBytes +
		decision.DefaultCacheBytes +
		policystate.BundleReadBytes +
		policystate.DefaultDecisionLogBufferBytes +
		int64(c.Limits.MaxReading)*c.MaxBodyBytes +
		decidingBytesPerBodyByte*c.MaxBodyBytes +
		int64(c.Limits.MaxConnections)*int64(c.HTTP.MaxHeaderBytes+connectionBufferBytes) +
		int64(c.watches().Max)*watchBytes + c.watches().MaxBytes
}

// MemoryBound is the peak resident memory the service stays within under any number of
// concurrent requests (docs/service.md): MemoryLimit and a third more for the garbage the
// collector has not returned yet.
func (c Config) MemoryBound() int64 {
	l := c.MemoryLimit()
	return l + l/3
}

// observeDecisionTime folds the time one decision took into the observed decision time, a
// moving average of the last few (an AuthZEN batch's cost is judged by it).
func (s *Server) observeDecisionTime(d time.Duration) {
	old := s.decisionNS.Load()
	if old == 0 {
		s.decisionNS.Store(int64(d))
		return
	}
	s.decisionNS.Store(old + (int64(d)-old)/8)
}
