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

// heapWatch samples the live heap until stop, and reads the heap memory obtained from the
// operating system (which never shrinks, so a spike between samples still shows in it).
type heapWatch struct {
	stopc      chan struct{}
	wg         sync.WaitGroup
	peak       uint64
	sysAtStart uint64
}

func watchHeap() *heapWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w := &heapWatch{stopc: make(chan struct{}), sysAtStart: ms.HeapSys}
	w.wg.Go(func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			w.peak = max(w.peak, s[0].Value.Uint64())
			select {
			case <-w.stopc:
				return
			case <-t.C:
			}
		}
	})
	return w
}

// stop returns the peak live heap sampled and the growth of the heap obtained from the OS.
func (w *heapWatch) stop() (peak, sysGrowth uint64) {
	close(w.stopc)
	w.wg.Wait()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return w.peak, ms.HeapSys - w.sysAtStart
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
		{"40 entries of 15 MiB", func() (es []policytest.BombEntry) {
			for j := range 40 {
				es = append(es, policytest.BombEntry{Name: fmt.Sprintf("e%d/data.json", j), Size: 15 << 20})
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
			t.Logf("bomb: %d bytes compressed, %d MiB decompressed", len(bomb), policytest.Gunzipped(t, bomb)>>20)

			w := watchHeap()
			srv.Publish(bomb)
			policytest.WaitFor(t, "the bomb to be refused", 60*time.Second, func() bool {
				b := src.Status().Bundles["authz"]
				return b != nil && b.Code != ""
			})
			peak, growth := w.stop()
			t.Logf("peak live heap %d MiB, heap obtained from the OS grew %d MiB", peak>>20, growth>>20)
			msg := src.Status().Bundles["authz"].Message
			assert.True(t, strings.Contains(msg, "beyond the bounds of a bundle"), "refused for its bounds: %s", msg)
			assert.Less(t, peak, uint64(96<<20), "peak live heap")
			assert.Less(t, growth, uint64(128<<20), "heap obtained from the OS")
			assert.Equal(t, rev, decideRevision(t, eng), "the refused bundle must not replace the active one")
		})
	}
	require.True(t, src.Ready())
}
