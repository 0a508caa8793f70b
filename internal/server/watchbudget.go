package server

import (
	"crypto/sha256"
	"errors"
	"sync"

	"github.com/authz-dev/authz/internal/watch"
)

// watchBudget shares the watches between callers (callerOf): a caller holds at most
// watches.maxPerCaller open watches and watches.maxBytesPerCaller bytes of their
// distinct request bodies (a body it watches many times counts once) and of their HTTP/2
// streams' cost (http2WatchBytes each), so that one client cannot fill watches.max or
// watches.maxBytes and lock every other caller out of new watches. Each is a quarter of the
// service's limit unless configured.
type watchBudget struct {
	maxCount int
	maxBytes int64

	mu       sync.Mutex
	byCaller map[string]*callerWatches
	byWatch  map[*watch.Watch]watchHeld
}

type callerWatches struct {
	count  int // places reserved or held
	bytes  int64
	bodies map[[sha256.Size]byte]int // watches of each distinct body
}

// watchHeld is what a watch holds of its caller's budget.
type watchHeld struct {
	caller string
	key    [sha256.Size]byte
	size   int64
	extra  int64 // counted for this watch alone: an HTTP/2 watch's cost (http2WatchBytes)
}

// Errors of the budget: the caller holds its share of the watches or of their bytes.
var (
	errCallerWatches = errors.New("the caller holds its share of the watches")
	errCallerBytes   = errors.New("the caller's watches hold its share of the bytes")
)

func newWatchBudget(c WatchConfig) *watchBudget {
	b := &watchBudget{maxCount: c.MaxPerCaller, maxBytes: c.MaxBytesPerCaller,
		byCaller: map[string]*callerWatches{}, byWatch: map[*watch.Watch]watchHeld{}}
	if b.maxCount == 0 {
		b.maxCount = max(1, c.Max/4)
	}
	if b.maxBytes == 0 {
		b.maxBytes = max(1, c.MaxBytes/4)
	}
	return b
}

// reserve takes one of caller's places before its watch is decided; unreserve gives it back
// (the watch was not opened).
func (b *watchBudget) reserve(caller string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cw := b.byCaller[caller]
	if cw == nil {
		cw = &callerWatches{bodies: map[[sha256.Size]byte]int{}}
		b.byCaller[caller] = cw
	}
	if cw.count >= b.maxCount {
		b.forgetLocked(caller, cw)
		return errCallerWatches
	}
	cw.count++
	return nil
}

func (b *watchBudget) unreserve(caller string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cw := b.byCaller[caller]; cw != nil {
		cw.count--
		b.forgetLocked(caller, cw)
	}
}

// hold counts body against the caller's bytes (once per distinct body) and extra (the
// watch's own cost, counted for every watch) before the watch is added; the reservation
// stays. unhold undoes it when the watch was not added after all.
func (b *watchBudget) hold(caller string, body []byte, extra int64) (watchHeld, error) {
	h := watchHeld{caller: caller, key: sha256.Sum256(body), size: int64(len(body)), extra: extra}
	b.mu.Lock()
	defer b.mu.Unlock()
	cw := b.byCaller[caller]
	add := extra
	if cw.bodies[h.key] == 0 {
		add += h.size
	}
	if cw.bytes+add > b.maxBytes {
		return h, errCallerBytes
	}
	cw.bytes += add
	cw.bodies[h.key]++
	return h, nil
}

// unhold undoes hold.
func (b *watchBudget) unhold(h watchHeld) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unholdLocked(h)
}

func (b *watchBudget) unholdLocked(h watchHeld) {
	cw := b.byCaller[h.caller]
	if cw == nil {
		return
	}
	cw.bytes -= h.extra
	if n := cw.bodies[h.key] - 1; n > 0 {
		cw.bodies[h.key] = n
	} else {
		delete(cw.bodies, h.key)
		cw.bytes -= h.size
	}
}

// opened ties the held place and bytes to ww: closeWatch gives them back.
func (b *watchBudget) opened(ww *watch.Watch, h watchHeld) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byWatch[ww] = h
}

// closeWatch closes ww and gives its caller's place and bytes back (once).
func (s *Server) closeWatch(ww *watch.Watch) {
	ww.Close()
	b := s.watchBudget
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.byWatch[ww]
	if !ok {
		return
	}
	delete(b.byWatch, ww)
	b.unholdLocked(h)
	if cw := b.byCaller[h.caller]; cw != nil {
		cw.count--
		b.forgetLocked(h.caller, cw)
	}
}

func (b *watchBudget) forgetLocked(caller string, cw *callerWatches) {
	if cw.count == 0 && len(cw.bodies) == 0 {
		delete(b.byCaller, caller)
	}
}
