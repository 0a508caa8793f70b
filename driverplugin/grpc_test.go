package driverplugin

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/authz-dev/authz/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeDriver is a Driver whose answers the test sets.
type fakeDriver struct {
	desc      Description
	methods   []string
	checkFunc func(ctx context.Context, driverKey string, config map[string]any) (bool, string, error)
}

func (f *fakeDriver) Describe(context.Context) (Description, error) { return f.desc, nil }

func (f *fakeDriver) SupportedMethods(context.Context) ([]string, error) { return f.methods, nil }

func (f *fakeDriver) CheckConfig(ctx context.Context, driverKey string, config map[string]any) (bool, string, error) {
	return f.checkFunc(ctx, driverKey, config)
}

// connect serves d over an in-memory gRPC connection and returns the host-side client, whose
// Done follows processCtx (go-plugin passes the plugin process's context there).
func connect(tb testing.TB, processCtx context.Context, d Driver) *GRPCClient {
	tb.Helper()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	require.NoError(tb, (&DriverPlugin{Impl: d}).GRPCServer(nil, srv))
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(tb, err)
	tb.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-served
	})
	raw, err := (&DriverPlugin{}).GRPCClient(processCtx, nil, conn)
	require.NoError(tb, err)
	return raw.(*GRPCClient)
}

func TestDescribeRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		desc Description
	}{
		{
			name: "declared booleans",
			desc: Description{Key: "acme.daytona", EnvironmentDrivers: []EnvironmentDriver{{
				DriverKey: "daytona", Kind: KindSandboxProvider,
				SandboxCapabilities: map[string]any{"duplexCommandStream": true, "nativeSyncIn": false},
			}}},
		},
		{
			name: "absent declaration stays nil",
			desc: Description{Key: "k", EnvironmentDrivers: []EnvironmentDriver{{DriverKey: "d", Kind: KindEnvironmentDriver}}},
		},
		{
			name: "empty declaration stays empty, not nil",
			desc: Description{Key: "k", EnvironmentDrivers: []EnvironmentDriver{{DriverKey: "d", Kind: KindSandboxProvider, SandboxCapabilities: map[string]any{}}}},
		},
		{
			name: "a lying declaration reaches the host unchanged",
			desc: Description{Key: "k", EnvironmentDrivers: []EnvironmentDriver{{
				DriverKey: "d", Kind: KindSandboxProvider,
				SandboxCapabilities: map[string]any{"duplexCommandStream": "true", "nativeSyncIn": float64(1), "x": nil, "y": map[string]any{"a": []any{true}}},
			}}},
		},
		{
			name: "legacy field",
			desc: Description{Key: "k", EnvironmentDrivers: []EnvironmentDriver{
				{DriverKey: "a", Kind: KindSandboxProvider, SupportsReusableLeases: testutil.Ptr(true)},
				{DriverKey: "b", Kind: KindSandboxProvider, SupportsReusableLeases: testutil.Ptr(false)},
			}},
		},
		{
			name: "no entries",
			desc: Description{Key: "k"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := connect(t, t.Context(), &fakeDriver{desc: tt.desc})
			got, err := c.Describe(t.Context())
			require.NoError(t, err)
			assert.Equal(t, tt.desc, got)
		})
	}
}

func TestSupportedMethodsAndCheckConfig(t *testing.T) {
	d := &fakeDriver{
		methods: []string{"duplexChannelOpen", "environmentExecute"},
		checkFunc: func(_ context.Context, driverKey string, config map[string]any) (bool, string, error) {
			switch {
			case driverKey != "daytona":
				return false, "", errors.New("unknown driver key " + driverKey)
			case config["reject"] == true:
				return false, "rejected", nil
			}
			return true, "", nil
		},
	}
	c := connect(t, t.Context(), d)

	methods, err := c.SupportedMethods(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"duplexChannelOpen", "environmentExecute"}, methods)

	tests := []struct {
		name       string
		driverKey  string
		config     map[string]any
		wantOK     bool
		wantReason string
		wantErr    string
	}{
		{name: "accepted", driverKey: "daytona", config: map[string]any{"apiUrl": "https://x", "n": 2.5}, wantOK: true},
		{name: "nil config arrives as empty object", driverKey: "daytona", config: nil, wantOK: true},
		{name: "rejected with reason", driverKey: "daytona", config: map[string]any{"reject": true}, wantReason: "rejected"},
		{name: "driver error", driverKey: "other", config: map[string]any{}, wantErr: "unknown driver key other"},
		{name: "not JSON", driverKey: "daytona", config: map[string]any{"ch": make(chan int)}, wantErr: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason, err := c.CheckConfig(t.Context(), tt.driverKey, tt.config)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.False(t, ok)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantReason, reason)
		})
	}
}

func TestClientPassesCallerContext(t *testing.T) {
	sawDeadline := make(chan bool, 1)
	d := &fakeDriver{checkFunc: func(ctx context.Context, _ string, _ map[string]any) (bool, string, error) {
		_, has := ctx.Deadline()
		sawDeadline <- has
		<-ctx.Done() // the host's deadline reaches the driver
		return false, "", ctx.Err()
	}}
	c := connect(t, t.Context(), d)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	ok, _, err := c.CheckConfig(ctx, "daytona", map[string]any{})
	assert.False(t, ok)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
	select {
	case has := <-sawDeadline:
		assert.True(t, has, "the driver must see the caller's deadline")
	case <-time.After(5 * time.Second):
		t.Fatal("driver never called")
	}
}

func TestServerKeepsDriverStatus(t *testing.T) {
	d := &fakeDriver{checkFunc: func(context.Context, string, map[string]any) (bool, string, error) {
		return false, "", status.Error(codes.FailedPrecondition, "no credentials")
	}}
	c := connect(t, t.Context(), d)
	_, _, err := c.CheckConfig(t.Context(), "k", map[string]any{})
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok)
	assert.Equal(t, codes.FailedPrecondition, st.Code())
}

func TestDoneFollowsProcessContext(t *testing.T) {
	processCtx, exited := context.WithCancel(t.Context())
	c := connect(t, processCtx, &fakeDriver{})
	select {
	case <-c.Done():
		t.Fatal("Done closed while the process runs")
	default:
	}
	exited()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the process exited")
	}
}

func TestGRPCServerWithoutImpl(t *testing.T) {
	srv := grpc.NewServer()
	defer srv.Stop()
	err := (&DriverPlugin{}).GRPCServer(nil, srv)
	require.ErrorContains(t, err, "Impl is nil")
}

func TestPluginSets(t *testing.T) {
	set, ok := PluginSets[ProtocolVersion]
	require.True(t, ok)
	p, ok := set[PluginName].(*DriverPlugin)
	require.True(t, ok)
	assert.Nil(t, p.Impl, "the host's plugin set carries no implementation")
	assert.Equal(t, uint(ProtocolVersion), Handshake.ProtocolVersion)
	assert.NotEmpty(t, Handshake.MagicCookieKey)
	assert.NotEmpty(t, Handshake.MagicCookieValue)
}

func TestDeadlineStatusIsATimeOut(t *testing.T) {
	// The driver gives up with DeadlineExceeded while the caller's context is still live.
	d := &fakeDriver{checkFunc: func(context.Context, string, map[string]any) (bool, string, error) {
		return false, "", context.DeadlineExceeded
	}}
	c := connect(t, t.Context(), d)
	_, _, err := c.CheckConfig(t.Context(), "k", map[string]any{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
}
