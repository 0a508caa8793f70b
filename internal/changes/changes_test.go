package changes

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestListenersCalledUntilCancelled(t *testing.T) {
	var l Listeners[string]
	var a, b atomic.Int32
	var got []string
	cancelA := l.Add(func(s string) { a.Add(1); got = append(got, s) })
	l.Add(func(string) { b.Add(1) })
	l.Notify("p1")
	cancelA()
	cancelA() // a second cancel is harmless
	l.Notify("p2")
	require.Equal(t, int32(1), a.Load())
	require.Equal(t, int32(2), b.Load())
	require.Equal(t, []string{"p1"}, got)
}

func TestZeroValueNotifiesNobody(t *testing.T) {
	var l Listeners[int]
	l.Notify(1) // no listener: nothing happens, no panic
}
