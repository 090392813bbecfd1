// Package gatekeeper runs Gatekeeper's own policy engine on the generated
// template, for the tests that compare it with the enforcer. Nothing that
// ships links it; the manifests themselves come from internal/constraints.
package gatekeeper

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/open-policy-agent/frameworks/constraint/pkg/apis/externaldata/unversioned"
	"github.com/open-policy-agent/frameworks/constraint/pkg/client"
	"github.com/open-policy-agent/frameworks/constraint/pkg/client/drivers/rego"
	"github.com/open-policy-agent/frameworks/constraint/pkg/externaldata"
	"github.com/open-policy-agent/gatekeeper/v3/apis"
	"github.com/open-policy-agent/gatekeeper/v3/pkg/gator/reader"
	"github.com/open-policy-agent/gatekeeper/v3/pkg/target"
	"github.com/open-policy-agent/gatekeeper/v3/pkg/util"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/yaml"
)

// Engine is Gatekeeper's own policy engine (frameworks/constraint with
// Gatekeeper's admission target) loaded with one template and one
// constraint: what Gatekeeper's webhook would decide, without a cluster.
type Engine struct {
	client *client.Client
}

// Option configures an Engine.
type Option func(*[]rego.Arg) error

// ExternalData lets the template call Gatekeeper's external_data builtin on
// provider, as Gatekeeper's manager does: presenting the client certificate
// in certFile and keyFile, with no response cache (every review asks).
func ExternalData(provider *unversioned.Provider, certFile, keyFile string) Option {
	return func(args *[]rego.Arg) error {
		providers := externaldata.NewCache()
		if err := providers.Upsert(provider); err != nil {
			return fmt.Errorf("add Provider %s: %w", provider.Name, err)
		}
		watcher, err := certwatcher.New(certFile, keyFile)
		if err != nil {
			return fmt.Errorf("load the client certificate: %w", err)
		}
		*args = append(*args, rego.AddExternalDataProviderCache(providers), rego.EnableExternalDataClientAuth(),
			rego.AddExternalDataClientCertWatcher(watcher))
		return nil
	}
}

// NewEngine loads a ConstraintTemplate and a Constraint, both as YAML.
func NewEngine(ctx context.Context, templateYAML, constraintYAML []byte, opts ...Option) (*Engine, error) {
	args := []rego.Arg{rego.Externs("inventory")}
	for _, o := range opts {
		if err := o(&args); err != nil {
			return nil, err
		}
	}
	driver, err := rego.New(args...)
	if err != nil {
		return nil, fmt.Errorf("create rego driver: %w", err)
	}
	// The webhook's enforcement point: the decision Gatekeeper's admission
	// webhook would make.
	c, err := client.NewClient(
		client.Targets(&target.K8sValidationTarget{}),
		client.Driver(driver),
		client.EnforcementPoints(util.WebhookEnforcementPoint),
	)
	if err != nil {
		return nil, fmt.Errorf("create constraint client: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := apis.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	u, err := decodeYAML(templateYAML)
	if err != nil {
		return nil, fmt.Errorf("decode template: %w", err)
	}
	tmpl, err := reader.ToTemplate(scheme, u)
	if err != nil {
		return nil, fmt.Errorf("convert template: %w", err)
	}
	if _, err := c.AddTemplate(ctx, tmpl); err != nil {
		return nil, fmt.Errorf("add template: %w", err)
	}
	cons, err := decodeYAML(constraintYAML)
	if err != nil {
		return nil, fmt.Errorf("decode constraint: %w", err)
	}
	if _, err := c.AddConstraint(ctx, cons); err != nil {
		return nil, fmt.Errorf("add constraint: %w", err)
	}
	return &Engine{client: c}, nil
}

// AddObject puts one object into data.inventory, as Gatekeeper's sync does.
func (e *Engine) AddObject(ctx context.Context, obj *unstructured.Unstructured) error {
	if _, err := e.client.AddData(ctx, obj); err != nil {
		return fmt.Errorf("add %s %s/%s to inventory: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// Violation is one result of a review.
type Violation struct {
	Msg     string
	Details map[string]any
}

// ReviewDelete reviews a DELETE of the Node by the given user, as the
// API server would send it to Gatekeeper's webhook.
func (e *Engine) ReviewDelete(ctx context.Context, node *unstructured.Unstructured, user authenticationv1.UserInfo) ([]Violation, error) {
	raw, err := node.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode node: %w", err)
	}
	req := &admissionv1.AdmissionRequest{
		// Every review has its own uid, as the API server gives it.
		UID:       types.UID(uuid.NewString()),
		Kind:      metaGVK("", "v1", "Node"),
		Name:      node.GetName(),
		Operation: admissionv1.Delete,
		UserInfo:  user,
		OldObject: runtime.RawExtension{Raw: raw},
	}
	resp, err := e.client.Review(ctx, target.AugmentedReview{AdmissionRequest: req, IsAdmission: true})
	if err != nil {
		return nil, fmt.Errorf("review delete of node %s: %w", node.GetName(), err)
	}
	var out []Violation
	for _, r := range resp.Results() {
		v := Violation{Msg: r.Msg}
		if d, ok := r.Metadata["details"].(map[string]any); ok {
			v.Details = d
		}
		out = append(out, v)
	}
	return out, nil
}

func decodeYAML(b []byte) (*unstructured.Unstructured, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(j, &u.Object); err != nil {
		return nil, err
	}
	return u, nil
}

func metaGVK(group, version, kind string) metav1.GroupVersionKind {
	return metav1.GroupVersionKind{Group: group, Version: version, Kind: kind}
}

// RemoveObject takes one object out of data.inventory.
func (e *Engine) RemoveObject(ctx context.Context, obj *unstructured.Unstructured) error {
	if _, err := e.client.RemoveData(ctx, obj); err != nil {
		return fmt.Errorf("remove %s %s/%s from inventory: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}
