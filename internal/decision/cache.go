package decision

import (
	"container/list"
	"crypto/sha256"
	"slices"
	"sync"
	"sync/atomic"
)

// Defaults of the decision cache.
const (
	DefaultCacheEntries = 10000
	DefaultCacheBytes   = 16 << 20
)

// CacheOptions bound the decision cache. The zero value is the cache on, with the defaults.
type CacheOptions struct {
	// Disabled turns the cache off: every decision is evaluated.
	Disabled bool
	// MaxEntries bounds the decisions held; DefaultCacheEntries when zero or less.
	MaxEntries int
	// MaxBytes bounds the estimated memory of the decisions held; DefaultCacheBytes when zero or
	// less.
	MaxBytes int64
}

// CacheStats counts the work of the decision cache since the engine was made.
type CacheStats struct {
	Hits, Misses, Evictions uint64
}

// decisionCache holds decision documents (without decision_id and revision) by the digest of
// their input projected onto what the policy can read, least recently used first out.
type decisionCache struct {
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	entries map[[sha256.Size]byte]*list.Element
	order   list.List // front: most recently used
	bytes   int64

	hits, misses, evictions atomic.Uint64
}

type cacheEntry struct {
	key  [sha256.Size]byte
	doc  Document
	size int64
}

func newDecisionCache(o CacheOptions) *decisionCache {
	c := &decisionCache{maxEntries: o.MaxEntries, maxBytes: o.MaxBytes}
	if c.maxEntries <= 0 {
		c.maxEntries = DefaultCacheEntries
	}
	if c.maxBytes <= 0 {
		c.maxBytes = DefaultCacheBytes
	}
	c.entries = make(map[[sha256.Size]byte]*list.Element)
	return c
}

// get returns a copy of the document held under k.
func (c *decisionCache) get(k [sha256.Size]byte) (Document, bool) {
	c.mu.Lock()
	el, ok := c.entries[k]
	if !ok {
		c.mu.Unlock()
		c.misses.Add(1)
		return Document{}, false
	}
	c.order.MoveToFront(el)
	doc := el.Value.(*cacheEntry).doc
	c.mu.Unlock()
	c.hits.Add(1)
	doc.Reasons = slices.Clone(doc.Reasons)
	return doc, true
}

// put holds doc under k, evicting the least recently used entries beyond the bounds.
func (c *decisionCache) put(k [sha256.Size]byte, doc Document) {
	doc.DecisionID, doc.Revision = "", ""
	doc.Reasons = slices.Clone(doc.Reasons) // the caller's copy stays the caller's
	size := entrySize(doc)
	if size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.entries[k] = c.order.PushFront(&cacheEntry{key: k, doc: doc, size: size})
	c.bytes += size
	for len(c.entries) > c.maxEntries || c.bytes > c.maxBytes {
		last := c.order.Back()
		e := last.Value.(*cacheEntry)
		c.order.Remove(last)
		delete(c.entries, e.key)
		c.bytes -= e.size
		c.evictions.Add(1)
	}
}

// purge drops every entry (a new policy makes them unreachable anyway; this frees them).
func (c *decisionCache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
	c.order.Init()
	c.bytes = 0
}

func (c *decisionCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// entrySize estimates the memory of one entry: the key, the list element and map slot, the
// document and its strings.
func entrySize(d Document) int64 {
	n := int64(sha256.Size + 48 + 64 + 160)
	n += int64(len(d.Code) + len(d.Message))
	for _, r := range d.Reasons {
		n += int64(16 + len(r))
	}
	return n
}

func (c *decisionCache) stats() CacheStats {
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}
