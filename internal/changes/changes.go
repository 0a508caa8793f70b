// Package changes lets a holder of state tell its readers that the state changed, at once and
// without waiting on them: the facts of the plugin host, the active policy of an engine.
package changes

import "sync"

// Listeners are the functions to call after a change. The zero value is ready to use. A
// listener must return quickly and must not block: it is called on the goroutine that made the
// change (typically it marks something dirty and wakes a goroutine of its own).
type Listeners[T any] struct {
	mu   sync.RWMutex
	next uint64
	fns  map[uint64]func(T)
}

// Add registers fn; cancel removes it (after cancel returns, fn is not called again once any
// call in progress has returned).
func (l *Listeners[T]) Add(fn func(T)) (cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fns == nil {
		l.fns = map[uint64]func(T){}
	}
	id := l.next
	l.next++
	l.fns[id] = fn
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.fns, id)
			l.mu.Unlock()
		})
	}
}

// Notify calls every listener with v.
func (l *Listeners[T]) Notify(v T) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, fn := range l.fns {
		fn(v)
	}
}
