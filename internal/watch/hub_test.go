package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDecider allows a request unless its plugin is in denied; it counts its decisions by
// plugin id.
type fakeDecider struct {
	mu       sync.Mutex
	denied   map[string]bool
	revision string
	fail     error
	calls    map[string]int
	total    atomic.Int64
}

func newFakeDecider() *fakeDecider {
	return &fakeDecider{denied: map[string]bool{}, revision: "r1", calls: map[string]int{}}
}

func (d *fakeDecider) Decide(_ context.Context, req *snapshot.Request, _ snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.total.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	id := pinnedPlugin(req)
	d.calls[id]++
	doc := decision.Document{Allow: !d.denied[id], Revision: d.revision, Reasons: []string{}}
	doc.Capabilities.DuplexCommandStream = doc.Allow
	if !doc.Allow {
		doc.Code, doc.Reasons = "DUPLEX_CHANNEL_CAPABILITY_DENIED", []string{"worker_not_running"}
	}
	return doc, snapshot.Input{"plugin": id}, d.fail
}

func (d *fakeDecider) set(change func(d *fakeDecider)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	change(d)
}

func (d *fakeDecider) callsFor(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[id]
}

func request(pluginID string, n int) *snapshot.Request {
	b, err := json.Marshal(map[string]any{"operation": snapshot.OpOpenDuplexChannel,
		"environment": map[string]any{"id": fmt.Sprint("env-", n), "driver": "sandbox"},
		"lease":       map[string]any{"id": "l", "metadata": map[string]any{"pluginId": pluginID}}})
	if err != nil {
		panic(err)
	}
	req, err := snapshot.ParseRequestBytes(b)
	if err != nil {
		panic(err)
	}
	return req
}

// open opens a watch the way the HTTP face does: reserve, decide, add.
func open(t testing.TB, h *Hub, d Decider, req *snapshot.Request) *Watch {
	t.Helper()
	res, err := h.Reserve()
	require.NoError(t, err)
	defer res.Release()
	seq := h.Seq()
	doc, _, err := d.Decide(context.Background(), req, nil)
	require.NoError(t, err)
	require.True(t, doc.Allow)
	w, err := h.Add(res, req, body(t, req), doc, seq)
	require.NoError(t, err)
	return w
}

func body(t testing.TB, req *snapshot.Request) []byte {
	t.Helper()
	b, err := json.Marshal(req.Document())
	require.NoError(t, err)
	return b
}

func next(t testing.TB, w *Watch) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	require.NoError(t, err)
	return ev
}

func requireNothing(t testing.TB, w *Watch) {
	t.Helper()
	ev, ok := w.Take()
	require.False(t, ok, "unexpected event %+v", ev)
}

// TestOneDecisionPerRequestNotPerWatch: a thousand watches of one request cost one
// re-decision per change.
func TestOneDecisionPerRequestNotPerWatch(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	defer h.Close()
	req := request("p1", 0)
	ws := make([]*Watch, 1000)
	for i := range ws {
		ws[i] = open(t, h, d, req)
	}
	before := d.callsFor("p1")
	d.set(func(d *fakeDecider) { d.denied["p1"] = true })
	h.FactsChanged("p1")
	for _, w := range ws {
		ev := next(t, w)
		require.Equal(t, KindRevoke, ev.Kind)
		require.False(t, ev.Doc.Allow)
		require.Equal(t, snapshot.OpOpenDuplexChannel, ev.Operation)
		_, err := w.Next(context.Background())
		require.ErrorIs(t, err, ErrEnded)
	}
	require.Equal(t, 1, d.callsFor("p1")-before, "re-decisions for 1000 watches of one request")
	require.Equal(t, 0, h.Open())
}

// TestOnlyTheChangedPluginsWatchesAreRedecided: a change of one plugin's facts leaves the
// watches of other plugins alone; a change of any ("") re-decides them all.
func TestOnlyTheChangedPluginsWatchesAreRedecided(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	defer h.Close()
	w1 := open(t, h, d, request("p1", 1))
	w2 := open(t, h, d, request("p2", 2))
	d.set(func(d *fakeDecider) { d.denied["p1"], d.denied["p2"] = true, true })
	before2 := d.callsFor("p2")
	h.FactsChanged("p1")
	require.Equal(t, KindRevoke, next(t, w1).Kind)
	require.Equal(t, before2, d.callsFor("p2"), "p2's watch was re-decided for p1's change")
	requireNothing(t, w2)
	h.PolicyChanged("r2")
	require.Equal(t, KindRevoke, next(t, w2).Kind)
}

// TestUpdateOnlyWhenTheGrantChanges: a re-decision that grants the same sends nothing; a new
// revision is an update; updates not taken are replaced by the latest.
func TestUpdateOnlyWhenTheGrantChanges(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	defer h.Close()
	w := open(t, h, d, request("p1", 1))
	calls := d.total.Load()
	h.FactsChanged("p1")
	require.Eventually(t, func() bool { return d.total.Load() > calls }, 10*time.Second, time.Millisecond)
	requireNothing(t, w)

	for _, rev := range []string{"r2", "r3"} {
		d.set(func(d *fakeDecider) { d.revision = rev })
		calls = d.total.Load()
		h.PolicyChanged(rev)
		require.Eventually(t, func() bool { return d.total.Load() > calls }, 10*time.Second, time.Millisecond)
	}
	ev := next(t, w)
	require.Equal(t, KindUpdate, ev.Kind)
	require.Equal(t, "r3", ev.Doc.Revision, "the latest update wins")
	requireNothing(t, w)
}

// TestAChangeDuringTheFirstDecisionIsNotLost: a change between the first decision and Add
// re-decides the request at once.
func TestAChangeDuringTheFirstDecisionIsNotLost(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{RecheckInterval: time.Hour})
	defer h.Close()
	req := request("p1", 1)
	res, err := h.Reserve()
	require.NoError(t, err)
	defer res.Release()
	seq := h.Seq()
	doc, _, err := d.Decide(context.Background(), req, nil)
	require.NoError(t, err)
	// The worker dies after the decision, before the watch is added.
	d.set(func(d *fakeDecider) { d.denied["p1"] = true })
	h.FactsChanged("p1")
	w, err := h.Add(res, req, body(t, req), doc, seq)
	require.NoError(t, err)
	require.Equal(t, KindRevoke, next(t, w).Kind)
}

// TestAFailedReDecisionRevokes: an evaluation error ends the watch with the fail-closed deny.
func TestAFailedReDecisionRevokes(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	defer h.Close()
	w := open(t, h, d, request("p1", 1))
	d.set(func(d *fakeDecider) { d.fail = coded.Errorf(coded.EvalTimeout, "too slow") })
	h.FactsChanged("")
	ev := next(t, w)
	require.Equal(t, KindRevoke, ev.Kind)
	require.False(t, ev.Doc.Allow)
	require.Equal(t, coded.EvalTimeout, ev.EvalCode)
	require.Equal(t, []string{"evaluation_failed"}, ev.Doc.Reasons)
	require.Equal(t, "DUPLEX_CHANNEL_CAPABILITY_DENIED", ev.Doc.Code)
}

// TestPeriodicRecheck: with no change signalled, the recheck re-decides.
func TestPeriodicRecheck(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{RecheckInterval: 20 * time.Millisecond})
	defer h.Close()
	w := open(t, h, d, request("p1", 1))
	d.set(func(d *fakeDecider) { d.denied["p1"] = true }) // no change signalled
	require.Equal(t, KindRevoke, next(t, w).Kind)
}

// TestCloseRevokesEveryWatchAndRefusesNewOnes.
func TestCloseRevokesEveryWatchAndRefusesNewOnes(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	ws := []*Watch{open(t, h, d, request("p1", 1)), open(t, h, d, request("", 2))}
	h.Close()
	h.Close()
	for _, w := range ws {
		ev := next(t, w)
		require.Equal(t, KindRevoke, ev.Kind)
		require.False(t, ev.Doc.Allow)
		require.Equal(t, []string{decision.ReasonServiceStopping}, ev.Doc.Reasons)
		require.Equal(t, "r1", ev.Doc.Revision)
		w.Close()
	}
	_, err := h.Reserve()
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, 0, h.Open())
}

// TestLimitCountsReservedAndOpenWatches: MaxWatches counts every place taken; a closed or
// revoked watch gives its place back, once.
func TestLimitCountsReservedAndOpenWatches(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{MaxWatches: 2})
	defer h.Close()
	w := open(t, h, d, request("p1", 1))
	res, err := h.Reserve()
	require.NoError(t, err)
	_, err = h.Reserve()
	require.ErrorIs(t, err, ErrLimit)
	res.Release()
	res.Release()
	w.Close()
	w.Close()
	require.Equal(t, 0, h.Open())
	w = open(t, h, d, request("p1", 1))
	d.set(func(d *fakeDecider) { d.denied["p1"] = true })
	h.FactsChanged("p1")
	require.Equal(t, KindRevoke, next(t, w).Kind)
	w.Close()
	require.Equal(t, 0, h.Open())
}

// TestGoWatch: the Go face decides, opens a watch on a grant only, and fails closed.
func TestGoWatch(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{})
	defer h.Close()
	first, w, err := h.Watch(context.Background(), request("p1", 1))
	require.NoError(t, err)
	require.Equal(t, KindDecision, first.Kind)
	require.True(t, first.Doc.Allow)
	require.NotNil(t, w)
	defer w.Close()

	d.set(func(d *fakeDecider) { d.denied["p2"] = true })
	first, w2, err := h.Watch(context.Background(), request("p2", 2))
	require.NoError(t, err)
	require.False(t, first.Doc.Allow)
	require.Nil(t, w2)

	d.set(func(d *fakeDecider) { d.fail = coded.Errorf(coded.EvalTimeout, "too slow") })
	first, w3, err := h.Watch(context.Background(), request("p3", 3))
	require.Error(t, err)
	require.Nil(t, w3)
	require.False(t, first.Doc.Allow)
	require.Equal(t, coded.EvalTimeout, first.EvalCode)
	require.Equal(t, 1, h.Open(), "only the grant holds a place")
}

// TestByteBudget: distinct requests count their bodies once each against MaxBytes; watches of
// one request share theirs; a group that ends gives its bytes back.
func TestByteBudget(t *testing.T) {
	d := newFakeDecider()
	r1, r2 := request("p1", 1), request("p2", 2)
	h := New(d, nil, Options{MaxBytes: int64(len(body(t, r1)) + 1)})
	defer h.Close()
	w1 := open(t, h, d, r1)
	w1b := open(t, h, d, r1) // the same body: no more bytes
	res, err := h.Reserve()
	require.NoError(t, err)
	_, err = h.Add(res, r2, body(t, r2), decision.Document{Allow: true}, h.Seq())
	require.ErrorIs(t, err, ErrBytes)
	res.Release()
	require.Equal(t, 2, h.Open(), "the two watches of r1")
	w1.Close()
	w1b.Close()
	w2 := open(t, h, d, r2)
	w2.Close()
}

// TestReleaseAfterAddKeepsThePlace: a deferred Release after a successful Add does not give
// the watch's place back; Add with a released reservation fails.
func TestReleaseAfterAddKeepsThePlace(t *testing.T) {
	d := newFakeDecider()
	h := New(d, nil, Options{MaxWatches: 1})
	defer h.Close()
	req := request("p1", 1)
	res, err := h.Reserve()
	require.NoError(t, err)
	w, err := h.Add(res, req, body(t, req), decision.Document{Allow: true}, h.Seq())
	require.NoError(t, err)
	res.Release()
	require.Equal(t, 1, h.Open())
	_, err = h.Reserve()
	require.ErrorIs(t, err, ErrLimit, "the watch still holds its place")
	w.Close()
	require.Equal(t, 0, h.Open())

	res, err = h.Reserve()
	require.NoError(t, err)
	res.Release()
	_, err = h.Add(res, req, body(t, req), decision.Document{Allow: true}, h.Seq())
	require.Error(t, err)
	require.Equal(t, 0, h.Open())
}

// slowDecider decides as fakeDecider after waiting for release (or its context).
type slowDecider struct {
	*fakeDecider
	slow    atomic.Bool
	entered atomic.Int64 // slow decisions begun
	release chan struct{}
}

func (d *slowDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	if d.slow.Load() {
		d.entered.Add(1)
		select {
		case <-d.release:
		case <-ctx.Done():
		}
	}
	return d.fakeDecider.Decide(ctx, req, f)
}

// TestReDecisionPastTheDeadlineRevokes: a change whose re-decision does not finish within
// the deadline revokes its watches (the grant may be gone and the service cannot tell in
// time); the late decision changes nothing after that, even when it would grant.
func TestReDecisionPastTheDeadlineRevokes(t *testing.T) {
	d := &slowDecider{fakeDecider: newFakeDecider(), release: make(chan struct{})}
	h := New(d, nil, Options{Deadline: 50 * time.Millisecond})
	defer h.Close()
	w := open(t, h, d, request("p1", 1))
	d.slow.Store(true)
	h.FactsChanged("p1")
	ev := next(t, w)
	require.Equal(t, KindRevoke, ev.Kind)
	require.False(t, ev.Doc.Allow)
	require.Equal(t, coded.EvalTimeout, ev.EvalCode)
	require.Equal(t, []string{"evaluation_failed"}, ev.Doc.Reasons)
	close(d.release) // the late decision grants: nothing more is sent
	_, err := w.Next(context.Background())
	require.ErrorIs(t, err, ErrEnded)
	require.Equal(t, 0, h.Open())
}

// TestCloseDoesNotWaitForASlowReDecision: Close cancels the re-decisions in flight (a driver
// that never answers its config check) instead of waiting for their time-out.
func TestCloseDoesNotWaitForASlowReDecision(t *testing.T) {
	d := &slowDecider{fakeDecider: newFakeDecider(), release: make(chan struct{})}
	h := New(d, nil, Options{DecideTimeout: time.Hour, Deadline: time.Hour})
	w := open(t, h, d, request("p1", 1))
	d.slow.Store(true)
	h.FactsChanged("p1")
	closed := make(chan struct{})
	go func() {
		// Close once the re-decision is in flight.
		for d.entered.Load() == 0 {
			runtime.Gosched()
		}
		h.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited on a re-decision that never ends")
	}
	ev := next(t, w)
	require.Equal(t, KindRevoke, ev.Kind)
	require.Equal(t, []string{decision.ReasonServiceStopping}, ev.Doc.Reasons)
}

// busyDecider decides as fakeDecider after a fixed time of work (as an evaluation takes), or
// fails when its context ends first.
type busyDecider struct {
	*fakeDecider
	busy time.Duration
}

func (d *busyDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	t := time.NewTimer(d.busy)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		doc, in, _ := d.fakeDecider.Decide(ctx, req, f)
		return doc, in, &coded.Error{Code: coded.EvalTimeout, Err: ctx.Err()}
	}
	return d.fakeDecider.Decide(ctx, req, f)
}

// TestAQueueOfReDecisionsIsNotAFailure: a change touching more distinct requests than the
// workers decide within the deadline revokes none of them when the policy still grants them
// all: the deadline bounds one re-decision once it has started (a stuck one), not the time a
// re-decision waits for its turn. When the change does take the grant away, every watch is
// revoked with the policy's own reason, none with evaluation_failed. (Before, the deadline ran
// from the change, and every watch still queued at that time was revoked with
// evaluation_failed.)
func TestAQueueOfReDecisionsIsNotAFailure(t *testing.T) {
	t.Parallel()
	const n = 400
	d := &busyDecider{fakeDecider: newFakeDecider(), busy: 2 * time.Millisecond}
	// 400 re-decisions of 2 ms on 2 workers take 400 ms at best: four times the deadline.
	h := New(d, nil, Options{Workers: 2, Deadline: 100 * time.Millisecond})
	defer h.Close()
	watches := make([]*Watch, n)
	for i := range watches {
		watches[i] = open(t, h, d, request(fmt.Sprint("p", i), i))
	}
	decided := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for d.total.Load() < want {
			require.True(t, time.Now().Before(deadline), "re-decided %d of %d", d.total.Load()-n, n)
			time.Sleep(time.Millisecond)
		}
	}

	// A revision that changes no decision: every watch stays open, nothing is sent.
	d.set(func(d *fakeDecider) { d.calls = map[string]int{} })
	h.PolicyChanged("r1")
	decided(2 * n)
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, g := range h.groups {
			if g.pass == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "every group's re-decision recorded")
	require.Equal(t, n, h.Open())
	for _, w := range watches {
		requireNothing(t, w)
	}

	// A revision that takes the grant away: every watch is revoked with the policy's reason.
	d.set(func(d *fakeDecider) {
		for i := range n {
			d.denied[fmt.Sprint("p", i)] = true
		}
	})
	h.PolicyChanged("r2")
	for _, w := range watches {
		ev := next(t, w)
		require.Equal(t, KindRevoke, ev.Kind)
		require.Empty(t, ev.EvalCode)
		require.Equal(t, []string{"worker_not_running"}, ev.Doc.Reasons)
	}
	require.Equal(t, 0, h.Open())
}

// bodyDecider is a fakeDecider that decodes watched bodies itself (BodyDecider): it records
// the bodies and operations it is handed, and how many decoded requests it was handed.
type bodyDecider struct {
	*fakeDecider
	mu      sync.Mutex
	bodies  [][]byte
	ops     []string
	decoded atomic.Int64
}

func (d *bodyDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.decoded.Add(1)
	return d.fakeDecider.Decide(ctx, req, f)
}

func (d *bodyDecider) DecideBody(ctx context.Context, op string, b []byte, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.mu.Lock()
	d.bodies, d.ops = append(d.bodies, b), append(d.ops, op)
	d.mu.Unlock()
	req, err := snapshot.ParseRequestBytes(b)
	if err != nil {
		return decision.FailedDocument(op), nil, err
	}
	return d.fakeDecider.Decide(ctx, req, f)
}

// TestReDecisionHandsTheBodyToABodyDecider: a re-decision hands a BodyDecider the watched body
// as sent, to decode where it bounds decoded requests (the service's deciding places), and
// never decodes it in the hub's workers.
func TestReDecisionHandsTheBodyToABodyDecider(t *testing.T) {
	d := &bodyDecider{fakeDecider: newFakeDecider()}
	h := New(d, nil, Options{})
	defer h.Close()
	req := request("p1", 0)
	w := open(t, h, d, req)
	require.Equal(t, int64(1), d.decoded.Load(), "the first decision")
	d.set(func(d *fakeDecider) { d.denied["p1"] = true })
	h.FactsChanged("p1")
	ev := next(t, w)
	require.Equal(t, KindRevoke, ev.Kind)
	require.Equal(t, snapshot.OpOpenDuplexChannel, ev.Operation)
	require.Equal(t, int64(1), d.decoded.Load(), "the re-decision was handed a request the hub decoded")
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Equal(t, [][]byte{body(t, req)}, d.bodies)
	require.Equal(t, []string{snapshot.OpOpenDuplexChannel}, d.ops)
}
