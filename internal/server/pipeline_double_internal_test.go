package server

import (
	"context"
	"sync"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pipeline"
	"github.com/authz-dev/authz/internal/snapshot"
)

// facesDouble is a recording pipeline double: it notes every call, then hands it on.
type facesDouble struct {
	next decisionPipeline
	mu   sync.Mutex
	seen []string
}

func (d *facesDouble) note(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, s)
}

func (d *facesDouble) calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}

func (d *facesDouble) Decide(c pipeline.Caller, face pipeline.Face, answer func(pipeline.Result)) {
	d.note("Decide " + face.Path)
	d.next.Decide(c, face, answer)
}

func (d *facesDouble) Body(c pipeline.Caller, serve func([]byte), answer func(pipeline.Result)) {
	d.note("Body")
	d.next.Body(c, serve, answer)
}

func (d *facesDouble) DecideBody(c pipeline.Caller, face pipeline.Face, parse func() (*snapshot.Request, error), batch pipeline.Batch, answer func(pipeline.Result)) {
	d.note("DecideBody " + face.Path)
	d.next.DecideBody(c, face, parse, batch, answer)
}

func (d *facesDouble) Recheck(c pipeline.Caller) error {
	d.note("Recheck")
	return d.next.Recheck(c)
}

func (d *facesDouble) Redecide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.note("Redecide")
	return d.next.Redecide(ctx, req, facts)
}

func (d *facesDouble) Event(ctx context.Context, rec pipeline.Record, revoke bool) bool {
	d.note("Event")
	return d.next.Event(ctx, rec, revoke)
}
