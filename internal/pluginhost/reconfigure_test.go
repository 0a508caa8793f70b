package pluginhost

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSamePluginSeesEveryField: changing any one field of a PluginConfig (every field of its
// limits, too) makes it another configuration, so that Reconfigure restarts the plugin. A field
// added to PluginConfig without a comparison in samePlugin fails here.
func TestSamePluginSeesEveryField(t *testing.T) {
	enabled := true
	base := PluginConfig{
		ID: "p", Path: "/opt/driver", SHA256: "ab", Key: "acme.p", Args: []string{"serve"},
		Enabled: &enabled, User: "u", Group: "g",
		ResourceLimits: ResourceLimits{AddressSpaceBytes: 1, Processes: 1, OpenFiles: 1, CPUSeconds: 1, DataBytes: 1, FileSizeBytes: 1, TempDirBytes: 1, MemoryMax: 1, PidsMax: 1},
	}
	// differ sets the field to another value of its type.
	var differ func(t *testing.T, path string, v reflect.Value) []string
	differ = func(t *testing.T, path string, v reflect.Value) []string {
		t.Helper()
		switch v.Kind() {
		case reflect.String:
			return []string{path}
		case reflect.Bool, reflect.Uint64, reflect.Slice, reflect.Pointer:
			return []string{path}
		case reflect.Struct:
			var out []string
			for i := range v.NumField() {
				out = append(out, differ(t, path+"."+v.Type().Field(i).Name, v.Field(i))...)
			}
			return out
		default:
			t.Fatalf("field %s has kind %s: teach this test (and samePlugin) about it", path, v.Kind())
			return nil
		}
	}
	fields := differ(t, "", reflect.ValueOf(base))
	require.Len(t, fields, 22, "every field of PluginConfig, its limits and its sandbox")
	for _, field := range fields {
		t.Run(field, func(t *testing.T) {
			changed := clonePlugin(base)
			v := reflect.ValueOf(&changed).Elem()
			for _, name := range strings.Split(strings.TrimPrefix(field, "."), ".") {
				v = v.FieldByName(name)
			}
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "x")
			case reflect.Bool:
				v.SetBool(!v.Bool())
			case reflect.Uint64:
				v.SetUint(v.Uint() + 1)
			case reflect.Slice:
				v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
			case reflect.Pointer: // Enabled: true → false
				off := false
				v.Set(reflect.ValueOf(&off))
			}
			assert.False(t, samePlugin(base, changed), "a change of %s went unnoticed", field)
			assert.True(t, samePlugin(base, clonePlugin(base)))
		})
	}

	t.Run("equal values in other memory are the same", func(t *testing.T) {
		other := base
		other.Args = []string{"serve"}
		on := true
		other.Enabled = &on
		assert.True(t, samePlugin(base, other))
		other.Enabled = nil // nil means enabled
		assert.True(t, samePlugin(base, other))
		other.SHA256 = "AB" // the same digest
		assert.True(t, samePlugin(base, other))
	})
}
