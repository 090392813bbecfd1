package rule

import (
	"encoding/json"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Parameters are a Constraint's spec.parameters, converted once for the
// entry points and reused for every evaluation; the zero value means none
// (the rule's defaults).
type Parameters struct {
	plain map[string]any
	value ast.Value
}

// NewParameters converts a Constraint's spec.parameters; nil means none.
func NewParameters(params map[string]any) (Parameters, error) {
	if params == nil {
		return Parameters{}, nil
	}
	v, err := ast.InterfaceToValue(params)
	if err != nil {
		return Parameters{}, fmt.Errorf("convert parameters: %w", err)
	}
	return Parameters{plain: params, value: v}, nil
}

// Value is the converted parameters, nil for none.
func (p Parameters) Value() ast.Value { return p.value }

// Map is the parameters as given, nil for none: for a reader outside this
// process (Gatekeeper's external data). It is shared: do not change it.
func (p Parameters) Map() map[string]any { return p.plain }

// MarshalJSON writes the parameters as given (null for none): how a decision
// log shows them.
func (p Parameters) MarshalJSON() ([]byte, error) { return json.Marshal(p.plain) }

// InputValue builds an entry point's input object from its fields: an ast.Value
// or Parameters as they are, other Go data converted with
// ast.InterfaceToValue (which, unlike rego.EvalInput, does not go through
// JSON). A nil field, nil map or zero Parameters is left out, which the
// entry points read as absent.
func InputValue(fields map[string]any) (ast.Value, error) {
	obj := ast.NewObject()
	for key, x := range fields {
		if m, ok := x.(map[string]any); ok && m == nil {
			continue
		}
		if p, ok := x.(Parameters); ok {
			x = p.value
		}
		if x == nil {
			continue
		}
		v, err := ast.InterfaceToValue(x)
		if err != nil {
			return nil, fmt.Errorf("convert input.%s: %w", key, err)
		}
		obj.Insert(ast.StringTerm(key), ast.NewTerm(v))
	}
	return obj, nil
}
