//go:build !linux

package server

// Without epoll, a client's close of a parked stream is noticed at the next write (a ping at
// the latest).

func (p *parked) pollAddLocked(*parkedStream)    {}
func (p *parked) pollRemoveLocked(*parkedStream) {}
func (p *parked) closePollLocked()               {}
