package tracing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/tracing"
)

func TestStartWithoutARecordingParentCostsNothing(t *testing.T) {
	ctx := t.Context()
	allocs := testing.AllocsPerRun(100, func() {
		c, span := tracing.Start(ctx, tracing.SpanInput)
		tracing.End(span, nil)
		if c != ctx {
			t.Fatal("the context changed")
		}
	})
	assert.Zero(t, allocs, "no allocation when tracing is off")
}

func TestStartOpensAChildOfTheRecordingSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	ctx, parent := tp.Tracer("test").Start(t.Context(), "parent")
	_, child := tracing.Start(ctx, tracing.SpanEvaluate)
	tracing.End(child, coded.Errorf(coded.EvalUndefined, "undefined"))
	_, plain := tracing.Start(ctx, tracing.SpanInput)
	tracing.End(plain, errors.New("no code"))
	parent.End()

	spans := rec.Ended()
	require.Len(t, spans, 3)
	assert.Equal(t, tracing.SpanEvaluate, spans[0].Name())
	assert.Equal(t, parent.SpanContext().SpanID(), spans[0].Parent().SpanID())
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	assert.Equal(t, string(coded.EvalUndefined), spans[0].Status().Description)
	assert.Equal(t, string(coded.EvalError), spans[1].Status().Description, "an error without a code is an evaluation error")
}
