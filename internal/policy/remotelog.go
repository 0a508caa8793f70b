package policy

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// warnEvery is how often a transient download failure of one bundle (its server unreachable,
// an HTTP error status, a download cut for its pace) is logged as a WARN; the others are at
// DEBUG. OPA retries them with back-off: they are not errors of the service.
const warnEvery = time.Minute

// opaQuiet is what the service log of the remote source keeps quiet: the failures of a
// download while the manager stops (context canceled), transient download failures beyond one
// WARN a minute per bundle, and OPA's "Bundle loaded and activated successfully." of a server
// without ETag when the download activated nothing new.
type opaQuiet struct {
	stopping atomic.Bool

	mu       sync.Mutex
	lastWarn map[string]time.Time // per bundle
	fresh    map[string]bool      // per bundle: its last activation brought something new
	now      func() time.Time
}

func newOPAQuiet() *opaQuiet {
	return &opaQuiet{lastWarn: map[string]time.Time{}, fresh: map[string]bool{}, now: time.Now}
}

// transient reports whether a download failure with this message is one OPA retries and the
// operator need not act on at once: the server unreachable, an HTTP error status, a cut.
func transient(msg string) bool {
	switch downloadReason(msg) {
	case "unreachable", "http_status", "stalled":
		return true
	}
	return false
}

// canceled reports whether msg is the failure of a download the manager's stop cancelled.
func (q *opaQuiet) canceled(msg string) bool {
	return q.stopping.Load() || strings.Contains(msg, "context canceled")
}

// warnNow reports whether a transient failure of bundle n is logged as a WARN now (at most
// once every warnEvery per bundle).
func (q *opaQuiet) warnNow(n string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if last, ok := q.lastWarn[n]; ok && now.Sub(last) < warnEvery {
		return false
	}
	q.lastWarn[n] = now
	return true
}

// recovered forgets the WARN of bundle n: its next failure is logged at once.
func (q *opaQuiet) recovered(n string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.lastWarn, n)
}

func (q *opaQuiet) setFresh(n string, fresh bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.fresh[n] = fresh
}

// isFresh reports whether the last activation of bundle n brought something new (true when
// unknown).
func (q *opaQuiet) isFresh(n string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	f, ok := q.fresh[n]
	return !ok || f
}
