// Package policies embeds the Rego sources of the rule so that every runtime
// (the generated Gatekeeper template, the enforcer, the OPA bundle) reads the
// same bytes.
package policies

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

//go:embed lib k8snodeguard k8snodeguardexternal nodeguard
var sources embed.FS

// gatekeeperCapabilities declares the builtins only Gatekeeper implements
// (external_data, which K8sNodeGuardExternal calls), for opa (`make lint`,
// `make policy-test`) and Go tests that compile every entry point.
//
//go:embed gatekeeper.capabilities.json
var gatekeeperCapabilities []byte

// GatekeeperBuiltins are the builtins only Gatekeeper implements, as
// gatekeeper.capabilities.json declares them.
func GatekeeperBuiltins() ([]*ast.Builtin, error) {
	c, err := ast.LoadCapabilitiesJSON(bytes.NewReader(gatekeeperCapabilities))
	if err != nil {
		return nil, fmt.Errorf("read policies/gatekeeper.capabilities.json: %w", err)
	}
	return c.Builtins, nil
}

// File is one Rego source file.
type File struct {
	Path   string // relative to policies/
	Source string
}

// Paths of the entry points; the library is everything under lib/.
const (
	// GatekeeperEntry reads Gatekeeper's synced data.inventory.
	GatekeeperEntry = "k8snodeguard/src.rego"
	// GatekeeperExternalEntry asks nodeguard serve for the facts through
	// Gatekeeper's external_data builtin, which only Gatekeeper implements:
	// it is not part of All or Compile.
	GatekeeperExternalEntry = "k8snodeguardexternal/src.rego"
	EnforcerEntry           = "nodeguard/decision.rego"
	// EnforcerQuery is the one query the enforcer prepares.
	EnforcerQuery = "data.nodeguard.decision"
)

// Library returns the rule library (package lib.*), tests excluded, sorted by path.
func Library() ([]File, error) {
	return collect("lib")
}

// All returns every non-test Rego file that OPA itself can run (the library,
// the enforcer's and the sync-based Gatekeeper entry points), sorted by path.
func All() ([]File, error) {
	return collect("lib", "k8snodeguard", "nodeguard")
}

// WithTests returns every Rego file, the Rego tests and the
// K8sNodeGuardExternal entry point included, sorted by path: what `opa test
// policies` runs.
func WithTests() ([]File, error) {
	return collectAll(true, "lib", "k8snodeguard", "k8snodeguardexternal", "nodeguard")
}

// PackageMetadata returns the package METADATA of one embedded file: its
// title and its custom fields (a template's or a policy's name, kind and
// version), each of custom required.
func PackageMetadata(path string, custom ...string) (title, description string, fields map[string]string, err error) {
	f, err := Read(path)
	if err != nil {
		return "", "", nil, err
	}
	m, err := ast.ParseModuleWithOpts(f.Path, f.Source, ast.ParserOptions{ProcessAnnotation: true})
	if err != nil {
		return "", "", nil, fmt.Errorf("parse %s: %w", f.Path, err)
	}
	for _, a := range m.Annotations {
		if a.Scope != "package" {
			continue
		}
		fields = map[string]string{}
		for _, k := range custom {
			v, _ := a.Custom[k].(string)
			if v == "" || a.Title == "" {
				return "", "", nil, fmt.Errorf("%s: package METADATA needs title and custom %s", f.Path, strings.Join(custom, ", "))
			}
			fields[k] = v
		}
		return a.Title, a.Description, fields, nil
	}
	return "", "", nil, fmt.Errorf("%s: no package METADATA", f.Path)
}

// Read returns one embedded file.
func Read(path string) (File, error) {
	b, err := sources.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("read embedded policy %s: %w", path, err)
	}
	return File{Path: path, Source: string(b)}, nil
}

func collect(roots ...string) ([]File, error) {
	return collectAll(false, roots...)
}

func collectAll(tests bool, roots ...string) ([]File, error) {
	var files []File
	for _, root := range roots {
		more, err := walk(root, tests)
		if err != nil {
			return nil, err
		}
		files = append(files, more...)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}

func walk(root string, tests bool) ([]File, error) {
	var files []File
	err := fs.WalkDir(sources, root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".rego") || (!tests && strings.HasSuffix(path, "_test.rego")) {
			return nil
		}
		f, err := Read(path)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk embedded policies under %s: %w", root, err)
	}
	return files, nil
}

// Compile parses and compiles every non-test Rego file once; queries over
// the result pass it to rego.Compiler.
func Compile() (*ast.Compiler, error) {
	files, err := All()
	if err != nil {
		return nil, err
	}
	modules := make(map[string]string, len(files))
	for _, f := range files {
		modules[f.Path] = f.Source
	}
	c, err := ast.CompileModulesWithOpt(modules, ast.CompileOpts{ParserOptions: ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true}})
	if err != nil {
		return nil, fmt.Errorf("compile embedded policies: %w", err)
	}
	return c, nil
}

// DefaultParameters evaluates data.lib.nodeguard.default_parameters (what a
// Constraint without parameters means) over compiled policies.
func DefaultParameters(ctx context.Context, compiled *ast.Compiler) (map[string]any, error) {
	return evalObject(ctx, compiled, "data.lib.nodeguard.default_parameters")
}

// Parameter is one parameter of the rule as policies/lib/nodeguard/parameters.rego
// declares it.
type Parameter struct {
	// Schema is an OpenAPI v3 schema fragment (structural).
	Schema      map[string]any `json:"schema"`
	Default     any            `json:"default"`
	Description string         `json:"description"`
	// UserGroups: the value is a list of group names the rule compares with
	// the requesting user's groups (the enforcer keeps only those groups).
	UserGroups bool `json:"user_groups"`
}

// DeclaredParameters evaluates data.lib.nodeguard.declared_parameters, the
// one declaration of every parameter, by name.
func DeclaredParameters(ctx context.Context, compiled *ast.Compiler) (map[string]Parameter, error) {
	const query = "data.lib.nodeguard.declared_parameters"
	declared, err := evalObject(ctx, compiled, query)
	if err != nil {
		return nil, err
	}
	// The value is plain JSON-shaped data; a round trip maps it onto the type.
	raw, err := json.Marshal(declared)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", query, err)
	}
	var out map[string]Parameter
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("decode %s: %w", query, err)
	}
	return out, nil
}

// ProvidedParameters evaluates data.lib.nodeguard.provided_parameters: the
// parameters nodeguard's answer sets for the K8sNodeGuardExternal template,
// sorted.
func ProvidedParameters(ctx context.Context, compiled *ast.Compiler) ([]string, error) {
	const query = "data.lib.nodeguard.provided_parameters"
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiled)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluate %s: %w", query, err)
	}
	names, ok := rego.ResultValue[[]any](rs)
	if !ok {
		return nil, fmt.Errorf("evaluate %s: want one set, got %v", query, rs)
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		s, ok := n.(string)
		if !ok {
			return nil, fmt.Errorf("evaluate %s: %v is not a parameter name", query, n)
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

// ProviderName evaluates data.lib.nodeguard.provider_name: the Gatekeeper
// Provider the K8sNodeGuardExternal template asks.
func ProviderName(ctx context.Context, compiled *ast.Compiler) (string, error) {
	const query = "data.lib.nodeguard.provider_name"
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiled)).Eval(ctx)
	if err != nil {
		return "", fmt.Errorf("evaluate %s: %w", query, err)
	}
	name, ok := rego.ResultValue[string](rs)
	if !ok || name == "" {
		return "", fmt.Errorf("evaluate %s: want a name, got %v", query, rs)
	}
	return name, nil
}

func evalObject(ctx context.Context, compiled *ast.Compiler, query string) (map[string]any, error) {
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiled)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluate %s: %w", query, err)
	}
	obj, ok := rego.ResultValue[map[string]any](rs)
	if !ok {
		return nil, fmt.Errorf("evaluate %s: want one object, got %v", query, rs)
	}
	return obj, nil
}

// DefaultGrace evaluates data.nodeguard.orphans.default_grace, how long a
// Node must have been not Ready when no grace is given: the orphan criteria's
// own default, which the enforcer's flags fall back to.
func DefaultGrace(ctx context.Context, compiled *ast.Compiler) (time.Duration, error) {
	const query = "data.nodeguard.orphans.default_grace"
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiled)).Eval(ctx)
	if err != nil {
		return 0, fmt.Errorf("evaluate %s: %w", query, err)
	}
	s, ok := rego.ResultValue[string](rs)
	if !ok {
		return 0, fmt.Errorf("evaluate %s: want one duration string, got %v", query, rs)
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("evaluate %s: %q is not a positive duration", query, s)
	}
	return d, nil
}

// TemplateVersion is the K8sNodeGuard template version declared in the
// Gatekeeper entry point's package METADATA (custom.version): the version of
// the rule the binary embeds.
func TemplateVersion() (string, error) {
	f, err := Read(GatekeeperEntry)
	if err != nil {
		return "", err
	}
	m, err := ast.ParseModuleWithOpts(f.Path, f.Source, ast.ParserOptions{ProcessAnnotation: true})
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", f.Path, err)
	}
	for _, a := range m.Annotations {
		if v, ok := a.Custom["version"].(string); ok && a.Scope == "package" && v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s: no custom.version in the package METADATA", f.Path)
}
