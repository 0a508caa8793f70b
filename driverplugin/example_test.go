package driverplugin_test

import (
	"context"

	"github.com/authz-dev/authz/driverplugin"
)

// daytona is an out-of-tree sandbox provider.
type daytona struct{}

func (daytona) Describe(context.Context) (driverplugin.Description, error) {
	return driverplugin.Description{
		Key: "acme.daytona",
		EnvironmentDrivers: []driverplugin.EnvironmentDriver{{
			DriverKey:           "daytona",
			Kind:                driverplugin.KindSandboxProvider,
			SandboxCapabilities: map[string]any{"duplexCommandStream": true},
		}},
	}, nil
}

func (daytona) SupportedMethods(context.Context) ([]string, error) {
	return []string{"duplexChannelOpen", "environmentExecute"}, nil
}

func (daytona) CheckConfig(_ context.Context, _ string, config map[string]any) (bool, string, error) {
	if _, ok := config["apiUrl"].(string); !ok {
		return false, "config.apiUrl must be a string", nil
	}
	return true, "", nil
}

// A driver's main function only calls Serve; authz starts the binary and talks to it over gRPC.
func ExampleServe() {
	driverplugin.Serve(daytona{})
}
