package driverplugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	driverpb "github.com/authz-dev/authz/driverplugin/proto"
)

// DriverPlugin is the go-plugin glue of a Driver: on the plugin side it registers Impl as the
// gRPC server, on the host side it dispenses a *GRPCClient. It speaks gRPC only.
type DriverPlugin struct {
	// NetRPCUnsupportedPlugin refuses go-plugin's legacy net/rpc protocol.
	plugin.NetRPCUnsupportedPlugin
	// Impl is the driver being served (plugin side only).
	Impl Driver
}

var (
	_ plugin.GRPCPlugin = (*DriverPlugin)(nil)
	_ plugin.Plugin     = (*DriverPlugin)(nil)
	_ Driver            = (*GRPCClient)(nil)
)

// GRPCServer implements plugin.GRPCPlugin (plugin side).
func (p *DriverPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("driverplugin: DriverPlugin.Impl is nil: serve a driver with driverplugin.Serve(d)")
	}
	driverpb.RegisterDriverServer(s, &grpcServer{impl: p.Impl})
	return nil
}

// GRPCClient implements plugin.GRPCPlugin (host side). ctx is go-plugin's context of the plugin
// process: it is done once the process has exited.
func (p *DriverPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &GRPCClient{client: driverpb.NewDriverClient(c), done: ctx.Done()}, nil
}

// GRPCClient is the host's view of a driver process. Every method passes the caller's context
// on to the RPC.
type GRPCClient struct {
	client driverpb.DriverClient
	done   <-chan struct{}
}

// Done is closed as soon as go-plugin has seen the driver process exit. From then on the
// driver's methods are gone; the host watches this to drop a crashed worker at once.
func (c *GRPCClient) Done() <-chan struct{} { return c.done }

// Describe implements Driver.
func (c *GRPCClient) Describe(ctx context.Context) (Description, error) {
	resp, err := c.client.Describe(ctx, &driverpb.DescribeRequest{})
	if err != nil {
		return Description{}, rpcError(ctx, "Describe", err)
	}
	d := Description{Key: resp.GetKey()}
	for _, e := range resp.GetEnvironmentDrivers() {
		ed := EnvironmentDriver{DriverKey: e.GetDriverKey(), Kind: e.GetKind()}
		if e.SandboxCapabilities != nil {
			ed.SandboxCapabilities = e.SandboxCapabilities.AsMap()
		}
		if e.SupportsReusableLeases != nil {
			v := *e.SupportsReusableLeases
			ed.SupportsReusableLeases = &v
		}
		d.EnvironmentDrivers = append(d.EnvironmentDrivers, ed)
	}
	return d, nil
}

// SupportedMethods implements Driver.
func (c *GRPCClient) SupportedMethods(ctx context.Context) ([]string, error) {
	resp, err := c.client.SupportedMethods(ctx, &driverpb.SupportedMethodsRequest{})
	if err != nil {
		return nil, rpcError(ctx, "SupportedMethods", err)
	}
	return append([]string(nil), resp.GetMethods()...), nil
}

// CheckConfig implements Driver. A config that cannot be carried as JSON is an error.
func (c *GRPCClient) CheckConfig(ctx context.Context, driverKey string, config map[string]any) (bool, string, error) {
	return c.CheckConfigWithin(ctx, driverKey, config, 0)
}

// CheckConfigWithin is CheckConfig with the answer's message bounded to maxAnswerBytes (0: the
// connection's bound): a larger answer is an error, and is not kept.
func (c *GRPCClient) CheckConfigWithin(ctx context.Context, driverKey string, config map[string]any, maxAnswerBytes int) (bool, string, error) {
	cfg, err := structpb.NewStruct(config)
	if err != nil {
		return false, "", fmt.Errorf("driver CheckConfig: config is not a JSON object: %w", err)
	}
	var opts []grpc.CallOption
	if maxAnswerBytes > 0 {
		opts = append(opts, grpc.MaxCallRecvMsgSize(maxAnswerBytes))
	}
	resp, err := c.client.CheckConfig(ctx, &driverpb.CheckConfigRequest{DriverKey: driverKey, Config: cfg}, opts...)
	if err != nil {
		return false, "", rpcError(ctx, "CheckConfig", err)
	}
	return resp.GetOk(), resp.GetReason(), nil
}

// rpcError names the RPC and, when the call timed out or was cancelled, wraps the matching
// context error so that errors.Is(err, context.DeadlineExceeded) works. The driver's side may
// see the propagated deadline pass a moment before the caller does, so a DeadlineExceeded
// status counts as a time-out even while the caller's context is still live.
func rpcError(ctx context.Context, method string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("driver %s: %w", method, ctxErr)
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return fmt.Errorf("driver %s: %w (%w)", method, context.DeadlineExceeded, err)
	case codes.Canceled:
		return fmt.Errorf("driver %s: %w (%w)", method, context.Canceled, err)
	}
	return fmt.Errorf("driver %s: %w", method, err)
}

// grpcServer adapts a Driver to the generated gRPC server interface.
type grpcServer struct {
	driverpb.UnimplementedDriverServer
	impl Driver
}

func (s *grpcServer) Describe(ctx context.Context, _ *driverpb.DescribeRequest) (*driverpb.DescribeResponse, error) {
	d, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, serverError(ctx, err)
	}
	resp := &driverpb.DescribeResponse{Key: d.Key}
	for i, e := range d.EnvironmentDrivers {
		pe := &driverpb.EnvironmentDriver{DriverKey: e.DriverKey, Kind: e.Kind}
		if e.SandboxCapabilities != nil {
			caps, err := structpb.NewStruct(e.SandboxCapabilities)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "environmentDrivers[%d].sandboxCapabilities cannot be sent as JSON: %v", i, err)
			}
			pe.SandboxCapabilities = caps
		}
		if e.SupportsReusableLeases != nil {
			v := *e.SupportsReusableLeases
			pe.SupportsReusableLeases = &v
		}
		resp.EnvironmentDrivers = append(resp.EnvironmentDrivers, pe)
	}
	return resp, nil
}

func (s *grpcServer) SupportedMethods(ctx context.Context, _ *driverpb.SupportedMethodsRequest) (*driverpb.SupportedMethodsResponse, error) {
	methods, err := s.impl.SupportedMethods(ctx)
	if err != nil {
		return nil, serverError(ctx, err)
	}
	return &driverpb.SupportedMethodsResponse{Methods: methods}, nil
}

func (s *grpcServer) CheckConfig(ctx context.Context, req *driverpb.CheckConfigRequest) (*driverpb.CheckConfigResponse, error) {
	ok, reason, err := s.impl.CheckConfig(ctx, req.GetDriverKey(), req.GetConfig().AsMap())
	if err != nil {
		return nil, serverError(ctx, err)
	}
	return &driverpb.CheckConfigResponse{Ok: ok, Reason: reason}, nil
}

// serverError turns a driver's error into a gRPC status, keeping a status the driver chose.
func serverError(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.FromContextError(err).Err()
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Unknown, err.Error())
}
