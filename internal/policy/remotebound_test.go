package policy

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
)

// heapWatch samples, until stop, the live heap and the memory the runtime holds from the
// operating system (mapped and not released).
type heapWatch struct {
	stopc              chan struct{}
	wg                 sync.WaitGroup
	peakLive, peakHeld uint64
	heldAtStart        uint64
}

func heldMemory(s []metrics.Sample) (live, held uint64) {
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64() - s[2].Value.Uint64()
}

func newSamples() []metrics.Sample {
	return []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
}

func watchHeap() *heapWatch {
	runtime.GC()
	w := &heapWatch{stopc: make(chan struct{})}
	_, w.heldAtStart = heldMemory(newSamples())
	w.wg.Go(func() {
		s := newSamples()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			live, held := heldMemory(s)
			w.peakLive, w.peakHeld = max(w.peakLive, live), max(w.peakHeld, held)
			select {
			case <-w.stopc:
				return
			case <-t.C:
			}
		}
	})
	return w
}

// stop returns the peak live heap and how much the memory held from the OS grew at its peak.
func (w *heapWatch) stop() (peakLive, heldGrowth uint64) {
	close(w.stopc)
	w.wg.Wait()
	return w.peakLive, max(w.peakHeld, w.heldAtStart) - w.heldAtStart
}

// TestRemoteBundleBombRefusedWithinBound: a bundle server serves compressed bundles of zeros
// that decompress to hundreds of MiB (unsigned, to a source that verifies): the download is
// refused by its bounds before OPA holds it, the heap stays far below the service's bound,
// and the active policy stays.
func TestRemoteBundleBombRefusedWithinBound(t *testing.T) {
	a, _ := policytest.Keys(t)
	good := policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID}
	srv := policytest.NewBundleServer(t)
	eng, src := startSource(t, remoteConfig(srv, a.Public, true, ""))
	for i, tc := range []struct {
		name    string
		entries []policytest.BombEntry
	}{
		{"3 entries of 400 MiB", []policytest.BombEntry{{Name: "a/data.json", Size: 400 << 20}, {Name: "b/data.json", Size: 400 << 20}, {Name: "c/data.json", Size: 400 << 20}}},
		{"100 entries of 6 MiB", func() (es []policytest.BombEntry) {
			for j := range 100 {
				es = append(es, policytest.BombEntry{Name: fmt.Sprintf("e%d/data.json", j), Size: 6 << 20})
			}
			return es
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev := fmt.Sprintf("good-%d", i)
			srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev, Sign: good}))
			policytest.WaitFor(t, "the signed bundle to be activated", 20*time.Second, func() bool {
				b := src.Status().Bundles["authz"]
				return eng.Revision() == rev && b != nil && b.Code == ""
			})
			bomb := policytest.BombBundle(t, tc.entries...)
			var size int64
			for _, e := range tc.entries {
				size += e.Size
			}
			t.Logf("bomb: %d bytes compressed, %d MiB of files", len(bomb), size>>20)

			w := watchHeap()
			srv.Publish(bomb)
			policytest.WaitFor(t, "the bomb to be refused", 60*time.Second, func() bool {
				b := src.Status().Bundles["authz"]
				return b != nil && b.Code != ""
			})
			peak, growth := w.stop()
			t.Logf("peak live heap %d MiB, memory held from the OS grew by %d MiB at its peak", peak>>20, growth>>20)
			msg := src.Status().Bundles["authz"].Message
			assert.True(t, strings.Contains(msg, "beyond the bounds of a bundle"), "refused for its bounds: %s", msg)
			assert.Less(t, peak, uint64(96<<20), "peak live heap")
			assert.Less(t, growth, uint64(128<<20), "memory held from the OS")
			assert.Equal(t, rev, decideRevision(t, eng), "the refused bundle must not replace the active one")
		})
	}
	require.True(t, src.Ready())
}
